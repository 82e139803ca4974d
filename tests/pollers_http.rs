//! The HTTP JSON poller against a real HTTP server on loopback.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use support::engine::run_one_watch;
use support::http_server::{Body, Reply, TestServer};
use watchbridge::poll::{PollError, PollResult, Poller};
use watchbridge::pollers::http::config::{HttpArgs, HttpMethod, Redacted};
use watchbridge::pollers::http::{HttpConfig, HttpPoller, HttpTarget};
use watchbridge::pollers::{RenderError, Resolve};

fn poller(config: HttpConfig) -> HttpPoller {
    HttpPoller::new(config).unwrap()
}

fn target(p: &HttpPoller, input: Value) -> Arc<HttpTarget> {
    Arc::new(p.resolve(&input, b"watch-1").unwrap())
}

async fn poll(p: &HttpPoller, t: &Arc<HttpTarget>) -> Result<PollResult, PollError> {
    p.poll(t.clone()).await
}

fn keys(r: &PollResult) -> Vec<String> {
    r.outputs
        .iter()
        .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
        .collect()
}

/// A feed that grows by one item per request: `{"data": [...], "done": <n == 3>}`.
fn growing_feed() -> impl Fn(&support::http_server::Seen) -> Reply {
    let calls = AtomicUsize::new(0);
    move |_| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let items: Vec<Value> = (1..=n.min(3))
            .map(|i| json!({"id": format!("e{i}"), "at": format!("2026-11-30T1{i}:00:00+01:00"), "n": i}))
            .collect();
        Reply::json(json!({"data": items, "done": n >= 3, "wm": 1_700_000_000_000_i64 + n as i64}))
    }
}

/// The settings that read [`growing_feed`]: items, key, time and completion.
fn growing_feed_config(server: &TestServer) -> HttpConfig {
    let mut c = HttpConfig::new(&server.url("/users/{/id}/events")).unwrap();
    c.items = "/data".into();
    c.item_key = "/id".into();
    c.item_time = Some("/at".into());
    c.complete = Some("/done".into());
    c
}

#[tokio::test]
async fn reads_items_keys_times_watermark_and_completion_at_the_configured_pointers() {
    let server = TestServer::start(growing_feed()).await;
    let mut c = growing_feed_config(&server);
    c.watermark = Some("/wm".into());
    let p = poller(c);
    let t = target(&p, json!({"id": 42}));

    let first = poll(&p, &t).await.unwrap();
    assert_eq!(keys(&first), ["e1"]);
    assert_eq!(first.outputs[0].event_time, 1_796_032_800_000); // 11:00+01:00 is 10:00 UTC
    let value: Value = serde_json::from_slice(&first.outputs[0].value).unwrap();
    assert_eq!(value["n"], 1);
    assert_eq!(first.watermark, Some(1_700_000_000_001));
    assert!(!first.complete);

    let second = poll(&p, &t).await.unwrap();
    assert_eq!(
        keys(&second),
        ["e1", "e2"],
        "every item; the engine drops the seen ones"
    );
    let third = poll(&p, &t).await.unwrap();
    assert!(third.complete);
    assert_eq!(server.requests()[0].target, "/users/42/events");
}

#[tokio::test]
async fn defaults_the_response_is_the_array_the_item_its_key_and_first_seen_its_time() {
    let server = TestServer::start(|_| Reply::json(json!([{"b": 2, "a": 1}, "plain", 7]))).await;
    let p = poller(HttpConfig::new(&server.url("/feed")).unwrap());
    let t = target(&p, json!({}));
    let before = now_ms();
    let r = poll(&p, &t).await.unwrap();
    assert_eq!(keys(&r), [r#"{"a":1,"b":2}"#, "plain", "7"]);
    for o in &r.outputs {
        assert!(o.event_time >= before && o.event_time <= now_ms() + 1);
    }
    assert_eq!(r.watermark, None);
    assert!(!r.complete);
}

#[tokio::test]
async fn event_times_may_be_epoch_millis() {
    let server =
        TestServer::start(|_| Reply::json(json!([{"id": 1, "t": 1_700_000_000_123_i64}]))).await;
    let mut c = HttpConfig::new(&server.url("/")).unwrap();
    c.item_key = "/id".into();
    c.item_time = Some("/t".into());
    let r = poll(&poller(c.clone()), &target(&poller(c), json!({})))
        .await
        .unwrap();
    assert_eq!(r.outputs[0].event_time, 1_700_000_000_123);
    assert_eq!(keys(&r), ["1"]);
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Three pages of `{"items": [..], "next": ...}` where `next(page)` says what points onward.
async fn paged(next: fn(&str, usize) -> Value, link: bool) -> (TestServer, HttpPoller) {
    let server = TestServer::start(move |seen| {
        let digits = seen.target.len() - seen.target.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let page: usize = seen.target[seen.target.len() - digits..].parse().unwrap();
        let items = json!([{"id": format!("p{page}a")}, {"id": format!("p{page}b")}]);
        let onward = if page < 3 { next(&seen.target, page + 1) } else { Value::Null };
        let mut reply = Reply::json(json!({"items": items, "next": if link { Value::Null } else { onward.clone() }, "wm": 100 - page as i64}));
        if link && page < 3 {
            reply = reply.header(
                "link",
                format!(r#"</first>; rel="first", <{}>; rel="next""#, onward.as_str().unwrap()),
            );
        }
        reply
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/items/1")).unwrap();
    c.items = "/items".into();
    c.item_key = "/id".into();
    c.next = Some("/next".into());
    c.watermark = Some("/wm".into());
    (server, poller(c))
}

#[tokio::test]
async fn pages_by_next_url_make_one_poll_result() {
    let (server, p) = paged(|_, n| json!(format!("/items/{n}")), false).await;
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(keys(&r), ["p1a", "p1b", "p2a", "p2b", "p3a", "p3b"]);
    assert_eq!(r.watermark, Some(97), "the lowest page watermark");
    let targets: Vec<_> = server.requests().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/items/1", "/items/2", "/items/3"]);
}

#[tokio::test]
async fn pages_by_cursor_set_the_cursor_parameter() {
    let (server, p) = paged(|_, n| json!(format!("c={n}")), false).await;
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(r.outputs.len(), 6);
    let targets: Vec<_> = server.requests().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        ["/items/1", "/items/1?cursor=c%3D2", "/items/1?cursor=c%3D3"]
    );
}

#[tokio::test]
async fn pages_by_link_header() {
    let (server, p) = paged(|_, n| json!(format!("/items/{n}")), true).await;
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(r.outputs.len(), 6);
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn the_page_limit_returns_what_it_read_and_promises_nothing_more() {
    let server = TestServer::start(|seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        Reply::json(
            json!({"items": [page], "next": format!("/p/{}", page + 1), "done": true, "wm": 5}),
        )
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/p/1")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    c.complete = Some("/done".into());
    c.watermark = Some("/wm".into());
    c.max_pages = 4;
    let p = poller(c);
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(keys(&r), ["1", "2", "3", "4"]);
    assert!(!r.complete);
    assert_eq!(r.watermark, None);
    assert_eq!(server.requests().len(), 4);
}

/// Issue 20: a listing longer than `WATCHBRIDGE_HTTP_MAX_PAGES` is read over several polls,
/// each continuing at the first page the last one did not read, and promising nothing (no
/// watermark, not final) until one reaches the last page; the poll after that starts at the
/// template's URL again. Before, every poll restarted at page one and items past page
/// `MAX_PAGES` were never read.
#[tokio::test]
async fn the_page_limit_continues_at_the_next_poll_where_the_last_one_stopped() {
    const PAGES: usize = 250;
    let server = TestServer::start(|seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let next = if page < PAGES {
            json!(format!("/p/{}", page + 1))
        } else {
            Value::Null
        };
        Reply::json(
            json!({"items": [page], "next": next, "done": page == PAGES, "wm": 1000 + page}),
        )
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/p/1")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    c.complete = Some("/done".into());
    c.watermark = Some("/wm".into());
    c.max_pages = 100;
    let p = poller(c);
    let t = target(&p, json!({}));
    let page_keys = |pages: std::ops::RangeInclusive<usize>| -> Vec<String> {
        pages.map(|n| n.to_string()).collect()
    };
    let mut all = Vec::new();
    let mut asked = 0;
    for (n, pages) in [(1, 1..=100), (2, 101..=200), (3, 201..=250)] {
        let r = poll(&p, &t).await.unwrap();
        let requests = server.requests();
        assert_eq!(
            requests[asked].target,
            format!("/p/{}", pages.start()),
            "poll {n} starts where poll {} stopped",
            n - 1
        );
        asked = requests.len();
        assert_eq!(keys(&r), page_keys(pages.clone()), "poll {n}");
        if n < 3 {
            assert!(!r.complete, "poll {n} read only part of the listing");
            assert_eq!(r.watermark, None, "poll {n} read only part of the listing");
        } else {
            assert!(r.complete, "poll 3 reached the last page");
            assert_eq!(r.watermark, Some(1201), "the lowest of the pages it read");
        }
        all.extend(keys(&r));
    }
    assert_eq!(all, page_keys(1..=PAGES), "every item exactly once");
    assert_eq!(asked, PAGES);
    // The last page was reached: the next poll starts over at the template's URL.
    let fourth = poll(&p, &t).await.unwrap();
    assert_eq!(server.requests()[PAGES].target, "/p/1");
    assert_eq!(keys(&fourth), page_keys(1..=100));
}

/// Where the next poll starts is kept only when a poll succeeded: a continued poll that
/// fails is retried from the same page, not from page one (nor from past the failure).
#[tokio::test]
async fn a_continued_poll_that_fails_is_retried_from_where_it_started() {
    let failed = Arc::new(AtomicUsize::new(0));
    let failures = failed.clone();
    let server = TestServer::start(move |seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        if page == 4 && failures.fetch_add(1, Ordering::SeqCst) == 0 {
            return Reply::status(500, "boom");
        }
        let next = if page < 5 {
            json!(format!("/p/{}", page + 1))
        } else {
            Value::Null
        };
        Reply::json(json!({"items": [page], "next": next}))
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/p/1")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    c.max_pages = 2;
    let p = poller(c);
    let t = target(&p, json!({}));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["1", "2"]);
    assert_eq!(poll(&p, &t).await.unwrap_err().kind, "http_5xx");
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["3", "4"]);
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["5"]);
    let targets: Vec<_> = server.requests().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        ["/p/1", "/p/2", "/p/3", "/p/4", "/p/3", "/p/4", "/p/5"]
    );
}

/// Issue 20: pages answered `304 Not Modified` (asked conditionally with validators from an
/// earlier poll) are not read, so they do not count toward `WATCHBRIDGE_HTTP_MAX_PAGES`:
/// a listing that grew behind unchanged pages is read to its end, and an unchanged listing
/// read over several polls is walked to its end by one poll of 304s.
#[tokio::test]
async fn pages_answered_304_do_not_count_toward_the_page_limit() {
    let last = Arc::new(AtomicUsize::new(3));
    let pages = last.clone();
    let server = TestServer::start(move |seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let last = pages.load(Ordering::SeqCst);
        // A page changes (its ETag with it) when it gains a next link.
        let etag = format!("\"{page}-{}\"", page < last);
        if seen
            .headers
            .get("if-none-match")
            .is_some_and(|v| *v == *etag)
        {
            return Reply::status(304, "");
        }
        let next = if page < last {
            json!(format!("/p/{}", page + 1))
        } else {
            Value::Null
        };
        Reply::json(json!({"items": [page], "next": next})).header("etag", etag)
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/p/1")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    c.max_pages = 3;
    let p = poller(c);
    let t = target(&p, json!({}));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["1", "2", "3"]);
    // Pages 1 and 2 unchanged (304), page 3 now links on: 3, 4 and 5 are the three read.
    last.store(5, Ordering::SeqCst);
    let r = poll(&p, &t).await.unwrap();
    assert_eq!(keys(&r), ["3", "4", "5"], "the 304s did not count");
    let seen = server.requests();
    assert_eq!(seen.len(), 3 + 5);
    assert_eq!(seen[3].headers["if-none-match"], "\"1-true\"");
    // The listing now changes no more. One poll walks it to its end: five 304s, none read.
    let before = server.requests().len();
    let r = poll(&p, &t).await.unwrap();
    assert!(r.outputs.is_empty(), "{r:?}");
    let targets: Vec<_> = server.requests()[before..]
        .iter()
        .map(|s| s.target.clone())
        .collect();
    assert_eq!(targets, ["/p/1", "/p/2", "/p/3", "/p/4", "/p/5"]);

    // A listing of six pages, read three by three: pages 1-3, then 4-6. Their validators
    // are all kept, so the poll that starts over is six 304s and reaches the end.
    last.store(6, Ordering::SeqCst);
    let fresh = target(&p, json!({}));
    let before = server.requests().len();
    assert_eq!(keys(&poll(&p, &fresh).await.unwrap()), ["1", "2", "3"]);
    assert_eq!(keys(&poll(&p, &fresh).await.unwrap()), ["4", "5", "6"]);
    let mid = server.requests().len();
    assert_eq!(mid - before, 6);
    let r = poll(&p, &fresh).await.unwrap();
    assert!(r.outputs.is_empty(), "{r:?}");
    let statuses: Vec<_> = server.requests()[mid..]
        .iter()
        .map(|s| (s.target.clone(), s.headers.contains_key("if-none-match")))
        .collect();
    assert_eq!(
        statuses,
        (1..=6)
            .map(|n| (format!("/p/{n}"), true))
            .collect::<Vec<_>>(),
        "every page asked conditionally, the whole listing in one poll"
    );
}

#[tokio::test]
async fn a_next_link_back_to_a_page_already_read_ends_the_poll() {
    let server = TestServer::start(|_| Reply::json(json!({"items": [1], "next": "/same"}))).await;
    let mut c = HttpConfig::new(&server.url("/same")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    assert_eq!(
        poll(&p, &target(&p, json!({})))
            .await
            .unwrap()
            .outputs
            .len(),
        1
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn etag_and_last_modified_make_unchanged_pages_304s_with_nothing_new() {
    let server = TestServer::start(|seen| {
        let validator = if seen.target == "/a" { "if-none-match" } else { "if-modified-since" };
        if seen.headers.contains_key(validator) {
            return Reply::status(304, "");
        }
        let reply = Reply::json(json!({"items": [seen.target.clone()], "next": if seen.target == "/a" { json!("/b") } else { Value::Null }}));
        if seen.target == "/a" {
            reply.header("etag", "\"v1\"")
        } else {
            reply.header("last-modified", "Sun, 29 Nov 2026 10:00:00 GMT")
        }
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/a")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    let t = target(&p, json!({}));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["/a", "/b"]);
    let again = poll(&p, &t).await.unwrap();
    assert!(again.outputs.is_empty(), "{again:?}");
    let seen = server.requests();
    assert_eq!(seen.len(), 4, "the 304 page's next link is remembered");
    assert_eq!(seen[2].headers["if-none-match"], "\"v1\"");
    assert_eq!(
        seen[3].headers["if-modified-since"],
        "Sun, 29 Nov 2026 10:00:00 GMT"
    );
}

#[tokio::test]
async fn a_poll_that_fails_half_way_remembers_no_validators() {
    let calls = AtomicUsize::new(0);
    let server = TestServer::start(move |seen| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        match seen.target.as_str() {
            "/a" => Reply::json(json!({"items": ["a"], "next": "/b"})).header("etag", "\"v1\""),
            _ if n == 1 => Reply::status(500, "boom"),
            _ => Reply::json(json!({"items": ["b"]})),
        }
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/a")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    let t = target(&p, json!({}));
    assert_eq!(poll(&p, &t).await.unwrap_err().kind, "http_5xx");
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["a", "b"]);
    assert!(!server.requests()[2].headers.contains_key("if-none-match"));
}

#[tokio::test]
async fn configured_headers_are_sent_with_variables_expanded() {
    let server = TestServer::start(|seen| {
        if seen
            .headers
            .get("authorization")
            .is_some_and(|v| v == "Bearer t0ken")
        {
            Reply::json(json!([1]))
        } else {
            Reply::status(401, "no token")
        }
    })
    .await;
    let args = HttpArgs {
        url: Some(server.url("/")),
        headers: Some(Redacted(
            "Authorization: Bearer ${TEST_TOKEN}\nX-Tenant: a".into(),
        )),
        ..HttpArgs::defaults()
    };
    let env = |name: &str| (name == "TEST_TOKEN").then(|| "t0ken".to_string());
    let c = args.config(Duration::from_secs(5), &env).unwrap();
    assert!(!format!("{c:?}").contains("t0ken"));
    let p = poller(c);
    assert_eq!(
        poll(&p, &target(&p, json!({})))
            .await
            .unwrap()
            .outputs
            .len(),
        1
    );
    assert_eq!(server.requests()[0].headers["x-tenant"], "a");
}

async fn fault(reply: impl Fn() -> Reply + Send + Sync + 'static) -> PollError {
    let server = TestServer::start(move |_| reply()).await;
    let mut c = HttpConfig::new(&server.url("/x")).unwrap();
    c.items = "/items".into();
    c.item_key = "/id".into();
    c.item_time = Some("/t".into());
    c.timeout = Duration::from_millis(300);
    c.max_bytes = 1000;
    let p = poller(c);
    poll(&p, &target(&p, json!({}))).await.unwrap_err()
}

#[tokio::test]
async fn server_faults_are_poll_errors_with_their_kind() {
    let e = fault(|| Reply::status(500, "internal trouble")).await;
    assert_eq!((e.kind, e.permanent), ("http_5xx", false));
    assert!(
        e.message.contains("500") && e.message.contains("internal trouble"),
        "{e}"
    );

    let e = fault(|| Reply::status(429, "slow down").header("retry-after", "7")).await;
    assert_eq!(
        (e.kind, e.retry_after),
        ("http_429", Some(Duration::from_secs(7)))
    );

    let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let e = fault(move || Reply::status(503, "").header("retry-after", later.clone())).await;
    assert_eq!(e.kind, "http_503");
    let after = e.retry_after.unwrap();
    assert!(
        after > Duration::from_secs(100) && after <= Duration::from_secs(120),
        "{after:?}"
    );

    let e = fault(|| Reply::status(404, "")).await;
    assert_eq!(
        (e.kind, e.permanent),
        ("http_4xx", false),
        "a resource may appear later"
    );
    let e = fault(|| Reply::status(403, "forbidden")).await;
    assert_eq!((e.kind, e.permanent), ("http_4xx", true));
}

/// `Retry-After` as the server wrote it: the schedule caps it, the poller reports what was
/// asked. Seconds beyond a `u64` are as long as can be; a past date is no wait; a negative,
/// fractional or garbled value is no `Retry-After`.
#[tokio::test]
async fn retry_after_is_read_as_asked_and_odd_values_are_none() {
    let asked = |value: &'static str| async move {
        fault(move || Reply::status(429, "").header("retry-after", value))
            .await
            .retry_after
    };
    assert_eq!(
        asked("99999999999").await,
        Some(Duration::from_secs(99_999_999_999))
    );
    assert_eq!(
        asked("999999999999999999999999").await,
        Some(Duration::from_secs(u64::MAX)),
        "too many seconds for a u64: the longest wait, which the schedule caps"
    );
    let far = asked("Thu, 01 Jan 2099 00:00:00 GMT").await.unwrap();
    assert!(far > Duration::from_secs(70 * 365 * 86_400), "{far:?}");
    assert_eq!(
        asked("Thu, 01 Jan 1970 00:00:00 GMT").await,
        Some(Duration::ZERO)
    );
    for odd in ["-5", "1.5", "soon", ""] {
        assert_eq!(asked(odd).await, None, "{odd:?}");
    }
}

/// The poller in an engine on the real clock, against a server whose first answer is a
/// `429` with `Retry-After`; then the feed, final. The end and its reason, and how long it
/// took.
async fn after_a_429(
    retry_after: &'static str,
    termination: &str,
    retry_max: Duration,
) -> (watchbridge::reason::TerminatedReason, Duration, usize) {
    use watchbridge::schedule::{Retry, Schedule};
    use watchbridge::watch::WatchRules;

    let calls = AtomicUsize::new(0);
    let server = TestServer::start(move |_| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(429, "slow down").header("retry-after", retry_after)
        } else {
            Reply::json(json!({"data": [{"id": "e1", "at": 1}], "done": true}))
        }
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/x")).unwrap();
    c.items = "/data".into();
    c.item_key = "/id".into();
    c.item_time = Some("/at".into());
    c.complete = Some("/done".into());
    let p = Arc::new(poller(c));
    let input = Arc::new(p.resolve(&json!({}), b"w").unwrap());
    let rules = WatchRules {
        catch_up: Default::default(),
        termination: termination.parse().unwrap(),
        schedule: Schedule {
            jitter: 0.0,
            // The Retry-After cap is the retry maximum by default.
            retry: Retry {
                initial: Duration::from_millis(50),
                max: retry_max,
                limit: 10,
                ..Schedule::default().retry
            },
            ..Schedule::default()
        },
    };
    let run = run_one_watch(
        p,
        input,
        "w",
        rules,
        Duration::from_secs(5),
        &format!("Retry-After {retry_after:?}"),
    )
    .await;
    (run.reason, run.took, server.requests().len())
}

/// A far `Retry-After`, as seconds or as a date, waits only the cap (here the retry
/// maximum, 300 ms); a past, negative or garbled one waits the backoff.
#[tokio::test]
async fn in_the_engine_a_far_retry_after_waits_only_the_cap() {
    use watchbridge::reason::TerminatedReason;
    for value in [
        "99999999999",
        "Thu, 01 Jan 2099 00:00:00 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "-5",
        "soon",
    ] {
        let (reason, took, requests) =
            after_a_429(value, "never", Duration::from_millis(300)).await;
        assert_eq!(
            (reason, requests),
            (TerminatedReason::Final, 2),
            "{value:?}"
        );
        assert!(took < Duration::from_secs(3), "{value:?}: {took:?}");
    }
}

/// Whatever `Retry-After` says, `total(1s)` ends the watch at 1 s, without another request.
#[tokio::test]
async fn in_the_engine_a_far_retry_after_does_not_outlast_total() {
    use watchbridge::reason::TerminatedReason;
    for value in ["99999999999", "Thu, 01 Jan 2099 00:00:00 GMT"] {
        let (reason, took, requests) =
            after_a_429(value, "total(1s)", Duration::from_secs(60)).await;
        assert_eq!(
            (reason, requests),
            (TerminatedReason::Total, 1),
            "{value:?}"
        );
        // The engine's clock is whole milliseconds, and `total` counts from the input's
        // arrival, read up to a millisecond before this test's own start instant: the end
        // may come that much before 1 s by the test's clock (999.94 ms was seen in CI).
        assert!(
            took >= Duration::from_millis(995) && took < Duration::from_secs(3),
            "{value:?}: {took:?}"
        );
    }
}

#[tokio::test]
async fn a_slow_server_is_a_timeout() {
    let e = fault(|| Reply::json(json!({"items": []})).delayed(Duration::from_secs(5))).await;
    assert_eq!(e.kind, "timeout", "{e}");
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let p = poller(HttpConfig::new(&format!("http://{addr}/x")).unwrap());
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "connect", "{e}");
}

#[tokio::test]
async fn responses_that_do_not_match_the_settings_are_errors_naming_the_setting() {
    let e = fault(|| Reply::status(200, "{not json")).await;
    assert_eq!(e.kind, "malformed_json");
    let e = fault(|| Reply::json(json!({"elements": []}))).await;
    assert_eq!(e.kind, "missing_field");
    assert!(e.message.contains("WATCHBRIDGE_HTTP_ITEMS `/items`"), "{e}");
    let e = fault(|| Reply::json(json!({"items": [{"t": 1}]}))).await;
    assert!(
        e.message
            .contains("item 0 has no WATCHBRIDGE_HTTP_ITEM_KEY `/id`"),
        "{e}"
    );
    let e = fault(|| Reply::json(json!({"items": [{"id": 1, "t": "yesterday"}]}))).await;
    assert_eq!(e.kind, "bad_time");
    assert!(e.message.contains("`yesterday` is not an RFC 3339"), "{e}");
}

#[tokio::test]
async fn a_body_above_the_limit_is_refused_without_reading_it_all() {
    let e = fault(|| Reply::status(200, vec![b' '; 5000])).await;
    assert_eq!(e.kind, "too_large");
    // No Content-Length and no end: only a poller that stops reading by itself reports
    // `too_large`; one that read on would hit the 10 s timeout instead.
    let server = TestServer::start(|_| Reply {
        body: Body::Endless,
        ..Reply::status(200, "")
    })
    .await;
    let mut c = HttpConfig::new(&server.url("/x")).unwrap();
    c.timeout = Duration::from_secs(10);
    c.max_bytes = 100_000;
    let p = poller(c);
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "too_large", "{e}");
}

/// Issue 17, item 3: `WATCHBRIDGE_HTTP_MAX_BYTES` bounds a page, not a poll. A server that
/// always links another 1 MiB page (with and without `Content-Length`) made one poll read
/// `WATCHBRIDGE_HTTP_MAX_PAGES` × 1 MiB; with the default settings the poll now fails with
/// `over_budget` once it would read more than `WATCHBRIDGE_HTTP_MAX_POLL_BYTES` (16 MiB), and
/// the pages it read stay under that budget.
#[tokio::test]
async fn endless_next_pages_end_the_poll_at_the_per_poll_byte_budget() {
    const PAGE: usize = 1 << 20;
    for chunked in [false, true] {
        let server = TestServer::start(move |seen| {
            let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
            // `{"items":[],"next":"/p/N","pad":"xxxx…"}`, exactly PAGE bytes.
            let head = format!(r#"{{"items":[],"next":"/p/{}","pad":""#, page + 1);
            let mut body = head.into_bytes();
            body.resize(PAGE - 2, b'x');
            body.extend_from_slice(b"\"}");
            if chunked {
                Reply {
                    body: Body::Chunked(body),
                    ..Reply::status(200, "")
                }
            } else {
                Reply::status(200, body)
            }
        })
        .await;
        let mut c = HttpConfig::new(&server.url("/p/1")).unwrap();
        c.items = "/items".into();
        c.next = Some("/next".into());
        let p = poller(c);
        let started = std::time::Instant::now();
        let result = poll(&p, &target(&p, json!({}))).await;
        let requests = server.requests().len();
        // Every page but the last asked for was read whole; the last one not (or in part).
        let read_whole = (requests - 1) * PAGE;
        let e = match result {
            Ok(r) => panic!(
                "chunked={chunked}: the poll succeeded after reading {requests} pages of 1 MiB \
                 ({} MiB) with {} outputs in {:?}; it should stop at the 16 MiB poll budget",
                requests,
                r.outputs.len(),
                started.elapsed()
            ),
            Err(e) => e,
        };
        assert_eq!(e.kind, "over_budget", "chunked={chunked}: {e}");
        assert!(
            e.message.contains("WATCHBRIDGE_HTTP_MAX_POLL_BYTES"),
            "chunked={chunked}: {e}"
        );
        assert!(
            read_whole <= 16 << 20,
            "chunked={chunked}: {requests} pages asked for, {read_whole} bytes read"
        );
        assert!(
            requests >= 16,
            "chunked={chunked}: the budget allows 16 pages: {requests}"
        );
    }
}

/// The item half of the budget: pages of many small items end the poll at
/// `WATCHBRIDGE_HTTP_MAX_POLL_ITEMS` (items are what a poll holds until the engine has
/// deduplicated them), before the page that would pass it is turned into outputs.
#[tokio::test]
async fn many_items_end_the_poll_at_the_per_poll_item_budget() {
    let server = TestServer::start(|seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let items: Vec<usize> = (0..400).map(|i| page * 1000 + i).collect();
        Reply::json(json!({"items": items, "next": format!("/p/{}", page + 1)}))
    })
    .await;
    let args = HttpArgs {
        url: Some(server.url("/p/1")),
        items: "/items".into(),
        next: Some("/next".into()),
        max_poll_items: 1000,
        ..HttpArgs::defaults()
    };
    let p = poller(args.config(Duration::from_secs(5), &|_| None).unwrap());
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "over_budget", "{e}");
    assert!(e.message.contains("WATCHBRIDGE_HTTP_MAX_POLL_ITEMS"), "{e}");
    assert_eq!(
        server.requests().len(),
        3,
        "pages 1 and 2 (800 items) fit, 3 does not"
    );
}

#[tokio::test]
async fn redirects_stay_on_the_watched_host_unless_allowed() {
    let other = TestServer::start(|_| Reply::json(json!(["elsewhere"]))).await;
    let other_url = other.url("/landing");
    let server = TestServer::start(move |seen| match seen.target.as_str() {
        "/same" => Reply::status(302, "").header("location", "/moved"),
        "/moved" => Reply::json(json!(["moved"])),
        _ => Reply::status(302, "").header("location", other_url.clone()),
    })
    .await;
    let p = poller(HttpConfig::new(&server.url("/{key}")).unwrap());
    let same = Arc::new(p.resolve(&json!({}), b"same").unwrap());
    assert_eq!(keys(&poll(&p, &same).await.unwrap()), ["moved"]);
    let away = Arc::new(p.resolve(&json!({}), b"away").unwrap());
    let e = poll(&p, &away).await.unwrap_err();
    assert_eq!(e.kind, "redirect_refused");
    assert!(e.message.contains(&other.url("/landing")), "{e}");
    assert!(
        other.requests().is_empty(),
        "the other host was never contacted"
    );

    let mut c = HttpConfig::new(&server.url("/{key}")).unwrap();
    c.allowed_hosts = Some(vec![
        allowed(&server.addr.to_string()),
        allowed(&other.addr.to_string()),
    ]);
    let p = poller(c);
    let away = Arc::new(p.resolve(&json!({}), b"away").unwrap());
    assert_eq!(keys(&poll(&p, &away).await.unwrap()), ["elsewhere"]);
}

#[tokio::test]
async fn a_redirect_loop_ends_after_ten_redirects() {
    let server = TestServer::start(|seen| {
        let n: usize = seen.target.trim_start_matches("/r").parse().unwrap_or(0);
        Reply::status(302, "").header("location", format!("/r{}", n + 1))
    })
    .await;
    let p = poller(HttpConfig::new(&server.url("/r0")).unwrap());
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "redirect_refused", "{e}");
    assert!(e.message.contains("more than 10 redirects"), "{e}");
    assert_eq!(server.requests().len(), 11);
}

fn allowed(host_port: &str) -> watchbridge::pollers::http::config::AllowedHost {
    let (host, port) = host_port.rsplit_once(':').unwrap();
    watchbridge::pollers::http::config::AllowedHost {
        host: host.into(),
        port: Some(port.parse().unwrap()),
    }
}

#[tokio::test]
async fn next_pages_on_another_host_are_refused() {
    let other = TestServer::start(|_| Reply::json(json!({"items": ["x"]}))).await;
    let next = other.url("/steal");
    let server =
        TestServer::start(move |_| Reply::json(json!({"items": ["a"], "next": next.clone()})))
            .await;
    let mut c = HttpConfig::new(&server.url("/a")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "next_refused", "{e}");
    assert!(other.requests().is_empty());
}

#[tokio::test]
async fn hostile_input_values_cannot_reach_another_host_or_path() {
    let server = TestServer::start(|_| Reply::json(json!([]))).await;
    let p = poller(HttpConfig::new(&server.url("/users/{/id}/events?tenant={key}")).unwrap());
    let evil = [
        "../../admin",
        "x/../../y",
        "a?b=c&d=e",
        "#fragment",
        "@evil.example:80",
        "user:pw@10.0.0.1/",
        "%2e%2e%2f",
        "/",
        "http://evil.example/",
        "a b\tc\nd",
        "\\..\\",
    ];
    for value in evil {
        let input = json!({ "id": value });
        let t = Arc::new(p.resolve(&input, value.as_bytes()).unwrap());
        let url = t.url();
        assert_eq!(url.host_str(), Some("127.0.0.1"), "{value:?}");
        assert_eq!(url.port(), Some(server.addr.port()), "{value:?}");
        assert_eq!(
            url.path_segments().unwrap().count(),
            3,
            "{value:?} -> {url}"
        );
        assert!(url.path().starts_with("/users/") && url.path().ends_with("/events"));
        assert_eq!(url.fragment(), None);
        let pairs: Vec<_> = url.query_pairs().collect();
        assert_eq!(pairs.len(), 1, "{value:?} -> {url}");
        assert_eq!(
            pairs[0].1, value,
            "the key arrives intact as one query value"
        );
        poll(&p, &t).await.unwrap();
        let asked = server.requests().last().unwrap().target.clone();
        let segment = asked.split('/').nth(2).unwrap();
        let decoded = percent_decode(segment);
        assert_eq!(
            decoded, value,
            "the server sees the value as one segment: {asked}"
        );
    }
}

#[tokio::test]
async fn dot_segments_are_refused_because_urls_read_them_as_directory_steps() {
    let p = poller(HttpConfig::new("http://127.0.0.1:1/users/{/id}/events").unwrap());
    for value in [".", ".."] {
        let e = p.resolve(&json!({ "id": value }), b"k").unwrap_err();
        assert!(e.to_string().contains("directory steps"), "{e}");
    }
    assert!(p.resolve(&json!({"id": "..."}), b"k").is_ok());
}

/// An empty value in the path would poll another resource (`/users/` is the collection):
/// the input is refused with the reason, so it goes to the dead-letter topic. In the query
/// an empty value is just empty.
#[tokio::test]
async fn an_empty_path_value_is_refused_and_integers_stay_exact() {
    let p = poller(HttpConfig::new("http://127.0.0.1:1/users/{/id}?tenant={/t}").unwrap());
    let e = p.resolve(&json!({"id": "", "t": "a"}), b"k").unwrap_err();
    assert!(
        e.to_string().contains("`{/id}`") && e.to_string().contains("empty"),
        "{e}"
    );
    let t = p.resolve(&json!({"id": "1", "t": ""}), b"k").unwrap();
    assert_eq!(t.url().as_str(), "http://127.0.0.1:1/users/1?tenant=");
    let big: Value = serde_json::from_str(r#"{"id": 12345678901234567890123, "t": 1}"#).unwrap();
    let t = p.resolve(&big, b"k").unwrap();
    assert_eq!(
        t.url().as_str(),
        "http://127.0.0.1:1/users/12345678901234567890123?tenant=1"
    );
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .unwrap()
        .into_owned()
}

#[tokio::test]
async fn inputs_that_cannot_name_a_url_are_refused_with_the_reason() {
    let p = poller(HttpConfig::new("http://127.0.0.1:1/users/{/id}").unwrap());
    assert_eq!(
        p.resolve(&json!({"name": "x"}), b"k").unwrap_err(),
        RenderError::Missing("/id".into())
    );
    let p = poller(
        HttpArgs {
            url: Some("http://{/host}/x".into()),
            allowed_hosts: Some("api.example:80".into()),
            ..HttpArgs::defaults()
        }
        .config(Duration::from_secs(5), &|_| None)
        .unwrap(),
    );
    assert!(p.resolve(&json!({"host": "api.example"}), b"k").is_ok());
    let e = p
        .resolve(&json!({"host": "internal.example"}), b"k")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not in WATCHBRIDGE_HTTP_ALLOWED_HOSTS"),
        "{e}"
    );
}

#[tokio::test]
async fn polls_are_rate_limited_per_host() {
    let p = poller(HttpConfig::new("http://API.example:8080/{key}").unwrap());
    let a = p.resolve(&json!({}), b"a").unwrap();
    assert_eq!(p.rate_key(&a).as_deref(), Some("api.example"));
}

/// Secret headers a template's origin needs and no other origin may see.
const SECRET_HEADERS: &str = "Authorization: Bearer s3cret\nX-Api-Key: k3y";

/// Settings with [`SECRET_HEADERS`], items at `/items`, next pages at `/next`.
fn with_secrets(url: &str, allowed_hosts: &str) -> HttpConfig {
    HttpArgs {
        url: Some(url.into()),
        items: "/items".into(),
        next: Some("/next".into()),
        headers: Some(Redacted(SECRET_HEADERS.into())),
        allowed_hosts: Some(allowed_hosts.into()),
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap()
}

/// Which configured or leaking headers one request carried.
fn leaked(seen: &support::http_server::Seen) -> Vec<&'static str> {
    ["authorization", "x-api-key", "referer"]
        .into_iter()
        .filter(|h| seen.headers.contains_key(*h))
        .collect()
}

/// Two loopback servers on different ports are two origins. Both are allowed, so the next
/// page on the other one is read, but without the template origin's headers.
#[tokio::test]
async fn configured_headers_go_only_to_the_templates_own_origin_on_next_pages() {
    let other = TestServer::start(|_| Reply::json(json!({"items": ["b"]}))).await;
    let next = other.url("/b");
    let server =
        TestServer::start(move |_| Reply::json(json!({"items": ["a"], "next": next.clone()})))
            .await;
    let p = poller(with_secrets(
        &server.url("/a"),
        &format!("{},{}", server.addr, other.addr),
    ));
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(keys(&r), ["a", "b"]);
    let own = &server.requests()[0];
    assert_eq!(own.headers["authorization"], "Bearer s3cret");
    assert_eq!(own.headers["x-api-key"], "k3y");
    let seen = other.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        leaked(&seen[0]),
        Vec::<&str>::new(),
        "the other origin saw configured headers"
    );
}

/// A redirect chain from the template's origin to another allowed origin and back: no hop
/// after the chain left the origin carries a configured header or a `Referer`.
#[tokio::test]
async fn configured_headers_and_referer_do_not_follow_a_redirect_chain_across_origins() {
    let server_addr = Arc::new(std::sync::OnceLock::<String>::new());
    let back = server_addr.clone();
    let other = TestServer::start(move |_| {
        Reply::status(307, "").header("location", format!("http://{}/final", back.get().unwrap()))
    })
    .await;
    let hop = other.url("/hop?from=start");
    let server = TestServer::start(move |seen| match seen.target.as_str() {
        "/start" => Reply::status(302, "").header("location", hop.clone()),
        _ => Reply::json(json!({"items": ["final"]})),
    })
    .await;
    server_addr.set(server.addr.to_string()).unwrap();
    let p = poller(with_secrets(
        &server.url("/start"),
        &format!("{},{}", server.addr, other.addr),
    ));
    let r = poll(&p, &target(&p, json!({}))).await.unwrap();
    assert_eq!(keys(&r), ["final"]);
    let own = server.requests();
    assert_eq!(own.len(), 2, "{own:?}");
    assert_eq!(leaked(&own[0]), ["authorization", "x-api-key"]);
    let hop = other.requests();
    assert_eq!(hop.len(), 1);
    assert_eq!(
        leaked(&hop[0]),
        Vec::<&str>::new(),
        "the other origin saw configured headers or a Referer"
    );
    assert_eq!(
        leaked(&own[1]),
        Vec::<&str>::new(),
        "once a chain has left the origin, what comes back carries nothing"
    );
}

/// A port-less entry of WATCHBRIDGE_HTTP_ALLOWED_HOSTS means the scheme's default port, not
/// every port: `localhost` allows `http://localhost/`, not `http://localhost:<any>/`.
#[tokio::test]
async fn an_allowed_host_without_a_port_allows_only_the_default_port() {
    let other = TestServer::start(|_| Reply::json(json!({"items": ["b"]}))).await;
    let next = format!("http://localhost:{}/b", other.addr.port());
    let server = TestServer::start(move |seen| match seen.target.as_str() {
        "/redirect" => Reply::status(302, "").header("location", next.clone()),
        _ => Reply::json(json!({"items": ["a"], "next": next.clone()})),
    })
    .await;
    let p = poller(with_secrets(
        &server.url("/{key}"),
        &format!("{},localhost", server.addr),
    ));
    let e = poll(&p, &Arc::new(p.resolve(&json!({}), b"a").unwrap()))
        .await
        .unwrap_err();
    assert_eq!(e.kind, "next_refused", "{e}");
    let e = poll(&p, &Arc::new(p.resolve(&json!({}), b"redirect").unwrap()))
        .await
        .unwrap_err();
    assert_eq!(e.kind, "redirect_refused", "{e}");
    assert!(other.requests().is_empty(), "{:?}", other.requests());
}

/// A host placeholder is allowed only with WATCHBRIDGE_HTTP_ALLOWED_HOSTS, and the host the
/// input makes is matched after the URL parser has normalised it: numeric and hex IPv4 forms
/// become dotted quads, so they match an IP entry and never a name.
#[tokio::test]
async fn a_host_from_the_input_is_matched_in_its_normal_form() {
    let server = TestServer::start(|_| Reply::json(json!([]))).await;
    let port = server.addr.port();
    let config = |allowed: &str| {
        HttpArgs {
            url: Some(format!("http://{{key}}:{port}/x")),
            allowed_hosts: Some(allowed.into()),
            ..HttpArgs::defaults()
        }
        .config(Duration::from_secs(5), &|_| None)
        .unwrap()
    };
    let by_name = poller(config(&format!("localhost:{port}")));
    for numeric in [
        "0x7f000001",
        "2130706433",
        "127.1",
        "0177.0.0.1",
        "127.0.0.1",
    ] {
        let e = by_name.resolve(&json!({}), numeric.as_bytes()).unwrap_err();
        assert!(
            e.to_string()
                .contains("not in WATCHBRIDGE_HTTP_ALLOWED_HOSTS"),
            "{numeric}: {e}"
        );
    }
    assert!(by_name.resolve(&json!({}), b"LOCALHOST").is_ok());
    let by_ip = poller(config(&format!("127.0.0.1:{port}")));
    for other in ["0x7f000002", "2130706434", "localhost"] {
        assert!(
            by_ip.resolve(&json!({}), other.as_bytes()).is_err(),
            "{other}"
        );
    }
    let t = Arc::new(by_ip.resolve(&json!({}), b"2130706433").unwrap());
    assert_eq!(t.url().as_str(), format!("http://127.0.0.1:{port}/x"));
    poll(&by_ip, &t).await.unwrap();
    assert_eq!(server.requests().len(), 1);
}

/// The poller inside the engine: a growing feed is emitted once per item, in order, and the
/// watch ends when the response says the set is final.
#[tokio::test]
async fn in_the_engine_each_item_is_emitted_once_and_the_watch_ends_when_final() {
    use watchbridge::reason::TerminatedReason;
    use watchbridge::schedule::Schedule;
    use watchbridge::termination::Termination;
    use watchbridge::watch::WatchRules;

    let server = TestServer::start(growing_feed()).await;
    let p = Arc::new(poller(growing_feed_config(&server)));
    let input = Arc::new(p.resolve(&json!({"id": 7}), b"user-7").unwrap());
    let rules = WatchRules {
        catch_up: Default::default(),
        termination: Termination::Never,
        schedule: Schedule {
            interval: Duration::from_millis(20),
            jitter: 0.0,
            ..Schedule::default()
        },
    };
    let run = run_one_watch(
        p,
        input,
        "user-7",
        rules,
        Duration::from_secs(5),
        "a growing feed",
    )
    .await;
    let emitted: Vec<String> = run
        .outputs
        .iter()
        .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
        .collect();
    let reason = run.reason;
    assert_eq!(emitted, ["e1", "e2", "e3"]);
    assert_eq!(reason, TerminatedReason::Final);
    assert_eq!(server.requests().len(), 3);
}

/// One poll against a server whose page links `next` (the rest of the page is fine).
async fn next_fault(next: String) -> PollError {
    let server = TestServer::start(move |_| Reply::json(json!({"items": [], "next": next}))).await;
    let mut c = HttpConfig::new(&server.url("/x")).unwrap();
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    poll(&p, &target(&p, json!({}))).await.unwrap_err()
}

/// Issue 17, item 7: a `next` value is outside content. In a message it is one line,
/// escaped, and bounded, so a server can neither forge a log line nor flood the log.
#[tokio::test]
async fn outside_content_in_a_poll_error_is_escaped_and_bounded() {
    let forged = "http://[\n2026-12-01T00:00:00.000000Z ERROR watchbridge: forged line\r\u{2028}x";
    let e = next_fault(forged.to_string()).await;
    assert_eq!(e.kind, "bad_next");
    let message = e.to_string();
    assert!(
        !message.contains(['\n', '\r', '\u{2028}']),
        "a control character reached the message: {message:?}"
    );
    assert!(
        message.contains(r"\n2026-12-01"),
        "escaped, not dropped: {message}"
    );
    // The same error as a JSON log line: still one line.
    let line = serde_json::to_string(&json!({"error": message})).unwrap();
    assert!(!line.contains('\n'));

    let huge = format!("http://[{}", "a".repeat(3 << 20));
    let e = next_fault(huge).await;
    assert_eq!(e.kind, "bad_next");
    assert!(
        e.message.len() < 2_000,
        "a {} byte message",
        e.message.len()
    );
    assert!(
        e.message.contains("more bytes"),
        "says it was cut: {}",
        &e.message[..e.message.len().min(500)]
    );
    // A valid but huge next URL on another host: refused, and the message stays bounded.
    let huge = format!("http://elsewhere.example/{}", "a".repeat(3 << 20));
    let e = next_fault(huge).await;
    assert_eq!(e.kind, "next_refused");
    assert!(
        e.message.len() < 2_000,
        "a {} byte message",
        e.message.len()
    );
}

/// Issue 17, item 8: the password in the template's user info, and a query parameter named
/// like a secret, never appear in a poll error.
#[tokio::test]
async fn url_secrets_never_appear_in_poll_errors() {
    let server = TestServer::start(|_| Reply::status(500, "down")).await;
    let url = server
        .url("/x?tenant=acme&access_token=qs-s3cret")
        .replace("http://", "http://ada:pw-hunter2@");
    let p = poller(HttpConfig::new(&url).unwrap());
    let e = poll(&p, &target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "http_5xx");
    let message = e.to_string();
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!message.contains("qs-s3cret"), "{message}");
    assert!(
        message.contains("tenant=acme"),
        "the rest is shown: {message}"
    );
    // A connection error too.
    let closed = "http://ada:pw-hunter2@127.0.0.1:9/x?token=qs-s3cret";
    let mut c = HttpConfig::new(closed).unwrap();
    c.timeout = Duration::from_secs(2);
    let p = poller(c);
    let message = poll(&p, &target(&p, json!({})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        !message.contains("hunter2") && !message.contains("qs-s3cret"),
        "{message}"
    );
}

/// The value of query parameter `name` in a request target, decoded.
fn query_param(target: &str, name: &str) -> Option<String> {
    url::Url::parse(&format!("http://h{target}"))
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// An API that filters by `since` (exclusive, epoch ms) over a feed that grows: each request
/// asks only for what is newer than the newest output the watch has seen, and gets only that.
#[tokio::test]
async fn incremental_requests_ask_only_for_what_is_new() {
    let feed = Arc::new(std::sync::Mutex::new(vec![(1_000i64, "a"), (2_000, "b")]));
    let server = {
        let feed = feed.clone();
        TestServer::start(move |seen| {
            let since: i64 = query_param(&seen.target, "since")
                .filter(|s| !s.is_empty())
                .map_or(i64::MIN, |s| s.parse().unwrap());
            let items: Vec<Value> = feed
                .lock()
                .unwrap()
                .iter()
                .filter(|(t, _)| *t > since)
                .map(|(t, id)| json!({"id": id, "at": t}))
                .collect();
            Reply::json(json!({ "items": items }))
        })
        .await
    };
    let config = HttpArgs {
        url: Some(
            server
                .url("/users/{/id}/events?since={last.time_ms}&after={last.key}&from={last.time}"),
        ),
        items: "/items".into(),
        item_key: "/id".into(),
        item_time: Some("/at".into()),
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap();
    let p = poller(config);
    let t = target(&p, json!({"id": 7}));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["a", "b"]);
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), Vec::<String>::new());
    feed.lock().unwrap().push((3_000, "c/d e"));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["c/d e"]);
    type Asked = (String, Option<String>, Option<String>, Option<String>);
    let asked: Vec<Asked> = server
        .requests()
        .iter()
        .map(|r| {
            (
                r.target.split('?').next().unwrap().to_string(),
                query_param(&r.target, "since"),
                query_param(&r.target, "after"),
                query_param(&r.target, "from"),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        asked,
        [
            ("/users/7/events".into(), s(""), s(""), s("")),
            (
                "/users/7/events".into(),
                s("2000"),
                s("b"),
                s("1970-01-01T00:00:02Z")
            ),
            (
                "/users/7/events".into(),
                s("2000"),
                s("b"),
                s("1970-01-01T00:00:02Z")
            ),
        ]
    );
    // The key is percent-encoded as one value.
    let last = server.requests().len();
    poll(&p, &t).await.unwrap();
    let target4 = &server.requests()[last].target;
    assert!(target4.contains("after=c%2Fd%20e"), "{target4}");

    // What the watch saves with its state gives a restored watch the same place.
    let saved = p.resume_state(&t).unwrap();
    let restored = target(&p, json!({"id": 7}));
    p.resume(&restored, &saved);
    poll(&p, &restored).await.unwrap();
    assert_eq!(server.requests().last().unwrap().target, *target4);
}

/// A cursor API (Dropbox's `list_folder/continue` shape): every page gives a cursor to
/// continue from, also the last one; the next poll starts from the last cursor.
#[tokio::test]
async fn a_cursor_api_continues_from_the_last_cursor() {
    let server = TestServer::start(|seen| {
        let cursor: usize = query_param(&seen.target, "cursor")
            .filter(|c| !c.is_empty())
            .map_or(0, |c| c.trim_start_matches('c').parse().unwrap());
        // Two items per page, five items in all: a cursor is the count read.
        let items: Vec<Value> = (cursor..(cursor + 2).min(5))
            .map(|i| json!({"id": format!("i{i}")}))
            .collect();
        let next = cursor + items.len();
        Reply::json(json!({"items": items, "cursor": format!("c{next}")}))
    })
    .await;
    let config = HttpArgs {
        url: Some(server.url("/files?cursor={last.cursor}")),
        items: "/items".into(),
        item_key: "/id".into(),
        next: Some("/cursor".into()),
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap();
    let p = poller(config);
    let t = target(&p, json!({}));
    assert_eq!(
        keys(&poll(&p, &t).await.unwrap()),
        ["i0", "i1", "i2", "i3", "i4"]
    );
    let before = server.requests().len();
    assert!(keys(&poll(&p, &t).await.unwrap()).is_empty());
    let second: Vec<String> = server.requests()[before..]
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(
        second,
        ["/files?cursor=c5"],
        "one request, from the last cursor"
    );
}

#[test]
fn last_placeholders_belong_in_the_query_and_a_cursor_needs_its_pointer() {
    for (url, next, expected) in [
        (
            "http://api/{last.time}/events",
            None,
            "must be in the query",
        ),
        (
            "http://api/events?c={last.cursor}",
            None,
            "WATCHBRIDGE_HTTP_NEXT",
        ),
        (
            "http://api/events?since={last.nope}",
            None,
            "unknown placeholder",
        ),
    ] {
        let e = HttpArgs {
            url: Some(url.into()),
            next: next.map(str::to_string),
            ..HttpArgs::defaults()
        }
        .config(Duration::from_secs(5), &|_| None)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("WATCHBRIDGE_HTTP_URL") && e.contains(expected),
            "{url}: {e}"
        );
    }
}

/// `WATCHBRIDGE_HTTP_METHOD=POST` with the body template `body` (nothing else set).
fn post(url: &str, body: &str) -> HttpConfig {
    HttpArgs {
        url: Some(url.into()),
        method: HttpMethod::Post,
        body: Some(body.into()),
        ..HttpArgs::defaults()
    }
    .config(Duration::from_secs(5), &|_| None)
    .unwrap()
}

/// The body a request carried, as JSON (it must be JSON).
fn sent(seen: &support::http_server::Seen) -> Value {
    serde_json::from_slice(&seen.body).unwrap_or_else(|e| {
        panic!(
            "the body is not JSON ({e}): {}",
            String::from_utf8_lossy(&seen.body)
        )
    })
}

/// Issue 20: GraphQL and search APIs are asked with POST and a JSON body made from the
/// input: a placeholder inside a JSON string is replaced by the value's text (escaped), one
/// standing as a whole value by the input's JSON value (a big integer exactly as written).
#[tokio::test]
async fn a_post_sends_the_json_body_made_from_the_input() {
    let server = TestServer::start(|_| Reply::json(json!({"items": ["a"]}))).await;
    let mut c = post(
        &server.url("/graphql"),
        r#"{"query": "events of {/user/name} ({key})",
            "variables": {"id": {/id}, "tags": {/tags}, "user": {/user}, "key": {key}, "n": "{/id}"}}"#,
    );
    c.items = "/items".into();
    let p = poller(c);
    let input: Value = serde_json::from_str(
        r#"{"id": 12345678901234567890123, "user": {"name": "Ada"}, "tags": ["a", 1, null]}"#,
    )
    .unwrap();
    let t = Arc::new(p.resolve(&input, b"user-1").unwrap());
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["a"]);
    let seen = &server.requests()[0];
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("POST", "/graphql")
    );
    assert_eq!(seen.headers["content-type"], "application/json");
    let mut body = sent(seen);
    assert_eq!(
        body["variables"]["id"].to_string(),
        "12345678901234567890123",
        "a number standing as a value is the input's number, exactly"
    );
    body["variables"]["id"] = json!("checked");
    assert_eq!(
        body,
        json!({
            "query": "events of Ada (user-1)",
            "variables": {
                "id": "checked",
                "tags": ["a", 1, null],
                "user": {"name": "Ada"},
                "key": "user-1",
                "n": "12345678901234567890123"
            }
        })
    );

    // GET, the default, sends no body.
    let server = TestServer::start(|_| Reply::json(json!([]))).await;
    let p = poller(HttpConfig::new(&server.url("/x")).unwrap());
    poll(&p, &target(&p, json!({}))).await.unwrap();
    let seen = &server.requests()[0];
    assert_eq!(seen.method, "GET");
    assert!(seen.body.is_empty() && !seen.headers.contains_key("content-type"));
}

/// A value from the input cannot break out of its string nor add members to the body:
/// whatever it holds, the server reads the body the template describes, with the value
/// as one string.
#[tokio::test]
async fn hostile_input_values_stay_inside_their_json_strings() {
    let server = TestServer::start(|_| Reply::json(json!([]))).await;
    let p = poller(post(
        &server.url("/search"),
        r#"{"name": "{/name}", "quoted": "<{/name}>", "as_value": {/name}, "key": "{key}", "admin": false}"#,
    ));
    let hostile = [
        "x\", \"admin\": true, \"y\": \"",
        "\\\", \"admin\": true}",
        "\"}, \"admin\": true, \"x\": {\"",
        "line\nbreak\r\t\u{0}\u{1f}\u{2028}",
        "{/name}{key}",
        "\\u0022",
    ];
    for (i, value) in hostile.into_iter().enumerate() {
        let t = Arc::new(
            p.resolve(&json!({ "name": value }), value.as_bytes())
                .unwrap(),
        );
        poll(&p, &t).await.unwrap();
        let body = sent(&server.requests()[i]);
        assert_eq!(
            body,
            json!({
                "name": value,
                "quoted": format!("<{value}>"),
                "as_value": value,
                "key": value,
                "admin": false
            }),
            "{value:?}"
        );
    }
}

/// An input that cannot fill the body never becomes a watch: the reason sends it to the
/// dead-letter topic (`unresolvable`), as for the URL.
#[tokio::test]
async fn inputs_that_cannot_fill_the_body_are_refused_with_the_reason() {
    let p = poller(post(
        "http://127.0.0.1:1/x",
        r#"{"id": "{/id}", "filter": {/filter}}"#,
    ));
    assert_eq!(
        p.resolve(&json!({"filter": 1}), b"k").unwrap_err(),
        RenderError::Missing("/id".into())
    );
    assert_eq!(
        p.resolve(&json!({"id": 1}), b"k").unwrap_err(),
        RenderError::Missing("/filter".into())
    );
    assert_eq!(
        p.resolve(&json!({"id": {"a": 1}, "filter": 1}), b"k")
            .unwrap_err(),
        RenderError::NotScalar("/id".into(), "an object")
    );
    assert!(p
        .resolve(&json!({"id": 1, "filter": {"any": [null]}}), b"k")
        .is_ok());
    let p = poller(post("http://127.0.0.1:1/x", r#"{"k": {key}}"#));
    assert_eq!(
        p.resolve(&json!({}), &[0xff]).unwrap_err(),
        RenderError::KeyNotUtf8
    );
}

/// With POST every page of a poll is asked with the same method and body; a cursor goes in
/// the query as with GET. Conditional requests still apply: unchanged pages are 304s.
#[tokio::test]
async fn a_post_asks_every_page_with_the_same_body_and_conditionally() {
    let server = TestServer::start(|seen| {
        let page: usize = seen
            .target
            .split_once("cursor=")
            .map_or(1, |(_, n)| n.parse().unwrap());
        let etag = format!("\"p{page}\"");
        if seen
            .headers
            .get("if-none-match")
            .is_some_and(|v| *v == *etag)
        {
            return Reply::status(304, "");
        }
        let next = if page < 3 {
            json!(page + 1)
        } else {
            Value::Null
        };
        Reply::json(json!({"items": [format!("p{page}")], "next": next})).header("etag", etag)
    })
    .await;
    let mut c = post(&server.url("/search?tenant=a"), r#"{"q": "{/q}"}"#);
    c.items = "/items".into();
    c.next = Some("/next".into());
    let p = poller(c);
    let t = target(&p, json!({"q": "ada"}));
    assert_eq!(keys(&poll(&p, &t).await.unwrap()), ["p1", "p2", "p3"]);
    assert!(poll(&p, &t).await.unwrap().outputs.is_empty());
    let seen = server.requests();
    let targets: Vec<_> = seen.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/search?tenant=a",
            "/search?tenant=a&cursor=2",
            "/search?tenant=a&cursor=3"
        ]
        .repeat(2)
    );
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.method, "POST", "request {i}");
        assert_eq!(s.headers["content-type"], "application/json", "request {i}");
        assert_eq!(sent(s), json!({"q": "ada"}), "request {i}");
        assert_eq!(
            s.headers.contains_key("if-none-match"),
            i >= 3,
            "request {i}"
        );
    }
}

/// Redirects of a POST: 307 and 308 keep the method and the body; 301, 302 and 303 turn it
/// into a GET without a body, as browsers do.
#[tokio::test]
async fn a_post_redirected_by_307_or_308_stays_a_post_and_by_301_302_303_becomes_a_get() {
    let server = TestServer::start(|seen| match seen.target.as_str() {
        "/final" => Reply::json(json!([seen.method.clone()])),
        other => Reply::status(other[1..].parse().unwrap(), "").header("location", "/final"),
    })
    .await;
    let p = poller(post(&server.url("/{key}"), r#"{"q": 1}"#));
    for (status, method) in [
        ("307", "POST"),
        ("308", "POST"),
        ("301", "GET"),
        ("302", "GET"),
        ("303", "GET"),
    ] {
        let t = Arc::new(p.resolve(&json!({}), status.as_bytes()).unwrap());
        assert_eq!(keys(&poll(&p, &t).await.unwrap()), [method], "{status}");
        let seen = server.requests();
        let [.., first, last] = &seen[..] else {
            panic!("{seen:?}")
        };
        assert_eq!(
            (first.method.as_str(), sent(first)),
            ("POST", json!({"q": 1}))
        );
        assert_eq!(last.target, "/final");
        assert_eq!(last.method, method, "{status}");
        if method == "POST" {
            assert_eq!(sent(last), json!({"q": 1}), "{status}");
            assert_eq!(last.headers["content-type"], "application/json");
        } else {
            assert!(last.body.is_empty(), "{status}: {:?}", last.body);
            assert!(!last.headers.contains_key("content-type"), "{status}");
        }
    }
}

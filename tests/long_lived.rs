//! Long-lived watches (issue 52), end to end through `watchbridge run` on the test broker:
//! an updated item emitted again once per version (`WATCHBRIDGE_HTTP_ITEM_VERSION`), a
//! capped catch-up (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`) and a watch that starts from now
//! (`WATCHBRIDGE_START_FROM=now`), each across a restart.

mod support;

use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::header;
use support::ops_client::Ops;
use support::scenario::{
    assert_each_once, free_port, output_key, outputs_to_end, produce_user, wait_for_outputs, Setup,
    T0,
};

/// Each output's identity as a test sees it: `key@version` (`key@` without a version).
fn versioned_keys(records: &[rdkafka::message::OwnedMessage]) -> Vec<String> {
    records
        .iter()
        .map(|m| {
            let version = header(m, "watchbridge-item-version").unwrap_or_default();
            format!("{}@{}", output_key(m), String::from_utf8_lossy(version))
        })
        .collect()
}

/// How many times each of `keys` occurs (nothing deduplicated).
fn counts(keys: Vec<String>) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for k in keys {
        *counts.entry(k).or_default() += 1;
    }
    counts
}

/// An edited item (its `updated_at` changes, its id stays) is emitted once per version, with
/// header `watchbridge-item-version`; an unchanged one once; a restart in between emits
/// nothing again (the recovery reads the version back with the key). Seen failing first:
/// without the version in the identity, `c1` came out once.
#[tokio::test(flavor = "multi_thread")]
async fn an_updated_item_is_emitted_once_per_version() {
    let version = Arc::new(Mutex::new(1));
    let current = version.clone();
    let server = TestServer::start(move |_| {
        let v = *current.lock().unwrap();
        Reply::json(json!({
            "events": [
                {"id": "c1", "at": T0, "updated_at": format!("2026-12-0{v}T00:00:00Z")},
                {"id": "c2", "at": T0 + 1, "updated_at": 7},
            ],
            "done": false,
        }))
    })
    .await;
    let s = Setup::new("versions", 1).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_HTTP_ITEM_VERSION", "/updated_at".into()));
    env.push(("WATCHBRIDGE_POLL_INTERVAL", "100ms".into()));
    let mut bridge = Bridge::start(&env);
    produce_user(&s.input, 1).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    *version.lock().unwrap() = 2;
    wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    // Restarted: the watch is restored live; the same versions come again and are not new.
    let mut bridge = Bridge::start(&env);
    tokio::time::sleep(Duration::from_secs(2)).await;
    *version.lock().unwrap() = 3;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(
        &counts(versioned_keys(&outputs)),
        [
            "c1@2026-12-01T00:00:00Z",
            "c1@2026-12-02T00:00:00Z",
            "c1@2026-12-03T00:00:00Z",
            "c2@7",
        ],
        &bridge.log(),
    );
}

/// The user's feed of `n` items `e0..e{n-1}` (event times T0 + i s), only those after
/// `since=` (epoch ms) when the request gives one: an API read incrementally, whose cursor
/// (`{last.time_ms}`) moves past everything a poll read.
fn feed_since(target: &str, n: i64, done: bool) -> Reply {
    let since: Option<i64> = target
        .split("since=")
        .nth(1)
        .and_then(|s| s.split('&').next())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap());
    let events: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("e{i}"), "at": T0 + i * 1000}))
        .filter(|e| since.is_none_or(|s| e["at"].as_i64().unwrap() > s))
        .collect();
    Reply::json(json!({"events": events, "done": done}))
}

/// A capped catch-up (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL=3`) over a final feed of 10 items
/// read with a `since=` cursor: every item exactly once, over at least four polls, though
/// the cursor moved past all ten at the first; a restart after the first three (the cursor
/// saved before the held-back items, so the restored watch asks for them again) loses and
/// repeats nothing. Seen failing first: without the cap all ten came in one poll.
#[tokio::test(flavor = "multi_thread")]
async fn a_capped_catch_up_emits_everything_once_over_several_polls() {
    let server = TestServer::start(|seen| feed_since(&seen.target, 10, true)).await;
    let s = Setup::new("capped", 1).await;
    let mut env = s.env(&server);
    env.retain(|(k, _)| *k != "WATCHBRIDGE_HTTP_URL");
    env.push((
        "WATCHBRIDGE_HTTP_URL",
        server.url("/users/{/id}/events?since={last.time_ms}"),
    ));
    env.push(("WATCHBRIDGE_MAX_OUTPUTS_PER_POLL", "3".into()));
    env.push(("WATCHBRIDGE_POLL_INTERVAL", "1s".into()));
    let port = free_port();
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let mut bridge = Bridge::start(&env);
    produce_user(&s.input, 1).await;
    let first = wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    assert_eq!(first.len(), 3, "one poll's worth: {}", bridge.log());
    let held = Ops::new(port).metric("watchbridge_outputs_held_back").await;
    assert!(held.is_some_and(|n| n > 0.0), "a catch-up shows: {held:?}");
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let mut bridge = Bridge::start(&env);
    wait_for_outputs(&s.output, 10, Duration::from_secs(60)).await;
    // The watch ends (final) once its backlog is emitted: wait for it to say so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = Ops::new(port).metric("watchbridge_outputs_held_back").await;
    assert_eq!(held, Some(0.0), "drained");
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = outputs_to_end(&s.output).await;
    let expected: Vec<String> = (0..10).map(|i| format!("e{i}")).collect();
    assert_each_once(
        &support::scenario::output_key_counts(&outputs),
        &expected,
        &bridge.log(),
    );
    let polls = server.requests().len();
    assert!(polls >= 4, "{polls} polls for 10 outputs, 3 a poll");
}

/// `WATCHBRIDGE_START_FROM=now`: the first poll's two items are recorded as seen, not
/// emitted; a restart (the watch restored) does not find them new; the item that comes
/// later is emitted, once. Seen failing first: without it, all three came out.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_now_emits_only_what_is_new_after_its_first_poll() {
    let items = Arc::new(Mutex::new(2));
    let count = items.clone();
    let server =
        TestServer::start(move |seen| feed_since(&seen.target, *count.lock().unwrap(), false))
            .await;
    let s = Setup::new("from-now", 1).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_START_FROM", "now".into()));
    env.push(("WATCHBRIDGE_POLL_INTERVAL", "200ms".into()));
    let port = free_port();
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let mut bridge = Bridge::start(&env);
    produce_user(&s.input, 1).await;
    // Polled a few times: the first poll is done and checkpointed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.requests().len() < 3 {
        assert!(std::time::Instant::now() < deadline, "{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let silent = Ops::new(port)
        .metric("watchbridge_outputs_seen_silently_total")
        .await;
    assert_eq!(silent, Some(2.0), "the first poll's two items");
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let mut bridge = Bridge::start(&env);
    let polled = server.requests().len();
    while server.requests().len() < polled + 3 {
        assert!(std::time::Instant::now() < deadline, "{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    *items.lock().unwrap() = 3;
    wait_for_outputs(&s.output, 1, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(
        &support::scenario::output_key_counts(&outputs),
        ["e2"],
        &bridge.log(),
    );
}

//! Long-lived watches (issue 52), end to end through `watchbridge run` on the test broker:
//! an updated item emitted again once per version (`WATCHBRIDGE_HTTP_ITEM_VERSION`), across
//! a restart.

mod support;

use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::header;
use support::scenario::{
    assert_each_once, output_key, outputs_to_end, produce_user, wait_for_outputs, Setup, T0,
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

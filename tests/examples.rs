//! The examples in `examples/`, each run as a user would run it (its binary, configured by
//! the environment) against the test broker and a loopback HTTP API: what each one shows
//! must hold, across a SIGKILL where it is about state.

mod support;

use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::{broker, header};
use support::ops_client::Ops;
use support::scenario::{
    assert_each_once, free_port, now_ms, output_key_counts, outputs_to_end, partition_watermarks,
    wait_for_outputs, Setup, T0,
};

/// The binary of example `name`, as `cargo test` builds it: in `examples/` beside the
/// `deps/` dir this test binary runs from (`target/<profile>/deps/examples-<hash>`). Built
/// once per test run with `cargo build --examples` in the same profile and target dir, so
/// that `cargo test --test examples` (which builds no example) never runs a missing or stale
/// one; after a whole `cargo test` that finds nothing to do.
fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary runs from target/<profile>/deps")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target/<profile>");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo
            .args(["build", "--examples", "--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir);
        // What cargo set for this test process describes this package, not a build: left
        // in, a dependency's build script that watches one of them (ring's watches
        // CARGO_MANIFEST_DIR) would see it changed and rebuild, and so would the next
        // `cargo test`, back and forth.
        for (name, _) in std::env::vars() {
            let set_by_cargo = name.starts_with("CARGO_PKG_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                ]
                .contains(&name.as_str());
            if set_by_cargo {
                cargo.env_remove(name);
            }
        }
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                cargo.arg("--release");
            }
            Some(profile) => {
                cargo.args(["--profile", profile]);
            }
            None => panic!("no profile dir in {}", exe.display()),
        }
        let status = cargo.status().expect("run cargo build --examples");
        assert!(status.success(), "cargo build --examples: {status}");
        profile_dir.join("examples")
    });
    let path = dir.join(name);
    assert!(path.exists(), "no example binary at {}", path.display());
    path
}

/// Logs each watch's end (`watch terminated … reason=…` is a debug line).
const LOG_WATCH_ENDS: &str = "info,librdkafka=warn,rdkafka=warn,watchbridge::internal_events=debug";

/// Group timeouts for a test that SIGKILLs the bridge: the restarted one is given the
/// partitions once the killed member's session expires (librdkafka's default, 45 s).
fn short_session(env: &mut Vec<(&'static str, String)>) {
    env.push(("KAFKA_SESSION_TIMEOUT_MS", "6000".into()));
    env.push(("KAFKA_HEARTBEAT_INTERVAL_MS", "1000".into()));
}

fn record_key(m: &OwnedMessage) -> String {
    String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned()
}

// ---- cursor_poller ----------------------------------------------------------------------

/// The `cursor` of a request target (`None`: the first page was asked for).
fn cursor_of(target: &str) -> Option<String> {
    url::Url::parse(&format!("http://h{target}"))
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "cursor")
        .map(|(_, v)| v.into_owned())
}

/// User 7's events `e0, e1, …` at T0 + i s, `visible` of them, two per page; the cursor
/// `c<i>` is the page that starts at event i. Any other user is 404.
async fn cursor_api(visible: Arc<AtomicI64>) -> TestServer {
    TestServer::start(move |seen| {
        let path = seen.target.split('?').next().unwrap();
        if path != "/users/7/events" {
            return Reply::status(404, "{}");
        }
        let start: i64 = cursor_of(&seen.target).map_or(0, |c| c[1..].parse().unwrap());
        let visible = visible.load(Ordering::SeqCst);
        let end = (start + 2).min(visible);
        let events: Vec<Value> = (start..end)
            .map(|i| json!({"id": format!("e{i}"), "at": T0 + i * 1000, "n": i}))
            .collect();
        let next = (end < visible).then(|| format!("c{end}"));
        Reply::json(json!({"events": events, "next": next}))
    })
    .await
}

/// The custom poller follows the cursors across pages, emits each event once with its
/// time, refuses an input without `/user` (dead letter) and fails a 404 user; after a
/// SIGKILL the restarted process asks from the cursor saved with the watch, not from the
/// first page, and every event is on the output topic exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn cursor_poller_follows_pages_and_resumes_from_the_saved_cursor_after_a_kill() {
    let visible = Arc::new(AtomicI64::new(5));
    let server = cursor_api(visible.clone()).await;
    let s = Setup::new("ex-cursor", 1).await;
    let mut env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", s.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", s.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", s.group.clone()),
        ("EXAMPLE_API_URL", server.url("")),
        ("WATCHBRIDGE_LOG", LOG_WATCH_ENDS.into()),
    ];
    short_session(&mut env);
    let program = example("cursor_poller");
    let mut bridge = Bridge::start_program(&program, &env);
    let b = broker();
    b.produce(
        &s.input,
        Some(0),
        Some(b"no-user"),
        br#"{"name": "x"}"#,
        &[],
    )
    .await;
    b.produce(
        &s.input,
        Some(0),
        Some(b"user-404"),
        br#"{"user": 404}"#,
        &[],
    )
    .await;
    b.produce(&s.input, Some(0), Some(b"user-7"), br#"{"user": 7}"#, &[])
        .await;

    let dead = b.consume(&s.dlq, 1, Duration::from_secs(30)).await;
    assert_eq!(record_key(&dead[0]), "no-user", "{}", bridge.log());
    let reason = header(&dead[0], "watchbridge-error").map(String::from_utf8_lossy);
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("/user")),
        "the reason names the missing field: {reason:?}"
    );
    bridge.wait_for_log_count("reason=failed", 1, Duration::from_secs(30));
    assert!(bridge.log().contains("not_found"), "{}", bridge.log());

    wait_for_outputs(&s.output, 5, Duration::from_secs(60)).await;
    // A few more polls (every 200 ms), and checkpoints (every 500 ms) to save the cursor.
    bridge.kill_after_polls(&server, 5).await;

    let asked: Vec<Option<String>> = server
        .requests()
        .iter()
        .filter(|r| r.target.starts_with("/users/7/"))
        .map(|r| cursor_of(&r.target))
        .collect();
    assert_eq!(
        asked[..3],
        [None, Some("c2".into()), Some("c4".into())],
        "the first poll reads the first page and follows `next` to the last: {asked:?}"
    );
    assert!(
        asked.len() > 5 && asked[3..].iter().all(|c| c.as_deref() == Some("c4")),
        "later polls start at the last page: {asked:?}"
    );

    // Four more events while it is down: e5 on the last page it read, e6..e8 after it.
    visible.store(9, Ordering::SeqCst);
    let before = server.requests().len();
    let mut bridge = Bridge::start_program(&program, &env);
    wait_for_outputs(&s.output, 9, Duration::from_secs(60)).await;
    let after: Vec<Option<String>> = server.requests()[before..]
        .iter()
        .filter(|r| r.target.starts_with("/users/7/"))
        .map(|r| cursor_of(&r.target))
        .collect();
    assert_eq!(
        after.first(),
        Some(&Some("c4".into())),
        "the restarted process asks from the saved cursor: {after:?}\n{}",
        bridge.log()
    );
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());

    let all = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&all),
        (0..9).map(|i| format!("e{i}")),
        &format!(
            "each event once across the pages and the kill\n{}",
            bridge.log()
        ),
    );
    let dead: Vec<String> = b.read_to_end(&s.dlq).await.iter().map(record_key).collect();
    assert_eq!(
        dead,
        ["no-user"],
        "only the input without `/user` is a dead letter"
    );
    for m in &all {
        let value: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        let n = value["n"].as_i64().unwrap();
        assert_eq!(value["id"], format!("e{n}"), "value = the event");
        assert_eq!(
            m.timestamp().to_millis(),
            Some(T0 + n * 1000),
            "time = `at`"
        );
        assert_eq!(record_key(m), "user-7");
    }
}

// ---- stop_after_outputs -----------------------------------------------------------------

/// The condition's count is saved with the watch: killed after 3 of its 5 outputs, the
/// restarted process emits 2 more and stops the watch, not 5 more (which a count starting
/// again at 0 would: 8 in all).
///
/// User 1's feed grows by one event per request, so each poll brings exactly one new
/// output; it stops growing at 3 until the kill, so the kill cannot land between a request
/// that grew it and the delivery of that output (a restart would then find two new ones).
#[tokio::test(flavor = "multi_thread")]
async fn stop_after_outputs_keeps_its_count_across_a_kill() {
    let items = Arc::new(AtomicI64::new(0));
    let cap = Arc::new(AtomicI64::new(3));
    let server = {
        let (items, cap) = (items.clone(), cap.clone());
        TestServer::start(move |seen| {
            if seen.target != "/users/1" {
                return Reply::status(404, "{}");
            }
            let cap = cap.load(Ordering::SeqCst);
            let n = items
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some((n + 1).min(cap))
                })
                .map_or(0, |before| (before + 1).min(cap));
            let events: Vec<Value> = (0..n)
                .map(|i| json!({"id": format!("u1-{i}"), "at": T0 + i}))
                .collect();
            Reply::json(json!({ "events": events }))
        })
        .await
    };
    let s = Setup::new("ex-stop", 1).await;
    let mut env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", s.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", s.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", s.group.clone()),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        ("WATCHBRIDGE_POLL_INTERVAL", "100ms".into()),
        ("WATCHBRIDGE_CHECKPOINT_INTERVAL", "200ms".into()),
        ("EXAMPLE_MAX_OUTPUTS", "5".into()),
        ("WATCHBRIDGE_LOG", LOG_WATCH_ENDS.into()),
    ];
    short_session(&mut env);
    let program = example("stop_after_outputs");
    let mut bridge = Bridge::start_program(&program, &env);
    broker()
        .produce(&s.input, Some(0), Some(b"user-1"), br#"{"id": 1}"#, &[])
        .await;
    wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    // More polls (which find nothing new) and several checkpoint intervals, then the kill.
    let polled = server.requests().len();
    while server.requests().len() < polled + 5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !bridge.log().contains("watch terminated"),
        "the watch is still going at 3 outputs:\n{}",
        bridge.log()
    );
    bridge.child.kill().unwrap();
    bridge.child.wait().unwrap();
    assert_eq!(
        outputs_to_end(&s.output).await.len(),
        3,
        "3 outputs at the kill"
    );

    cap.store(100, Ordering::SeqCst);
    let mut bridge = Bridge::start_program(&program, &env);
    bridge.wait_for_log_count("reason=max_outputs", 1, Duration::from_secs(60));
    // Ended: its feed is asked nothing more (10 poll intervals).
    let asked = server.requests().len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        server.requests().len(),
        asked,
        "an ended watch polls no more"
    );
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());

    let all = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&all),
        (0..5).map(|i| format!("u1-{i}")),
        &format!("5 outputs in all, 2 after the restart\n{}", bridge.log()),
    );
}

// ---- punctuated_watermarks --------------------------------------------------------------

/// Waits until partition 0's watermark has reached `at_least` on the watermark topic.
async fn wait_for_watermark(bridge: &Bridge, topic: &str, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let values = partition_watermarks(topic).await;
        if values.iter().any(|&v| v >= at_least) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "partition 0 never reached {at_least}: {values:?}\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The input partition's watermark is exactly what its markers say: it reaches each
/// marker's value, ordinary inputs (timestamped hours later) do not move it, a lower
/// marker does not take it back; markers start no watch (no output, no dead letter, no
/// request; counted as skipped) while the ordinary inputs' watches run as usual.
#[tokio::test(flavor = "multi_thread")]
async fn punctuated_watermarks_follow_the_markers_and_markers_start_no_watch() {
    let server = TestServer::start(|seen| {
        let user = seen.target.rsplit('/').next().unwrap();
        Reply::json(json!({"events": [{"id": format!("u{user}-a"), "at": now_ms()}]}))
    })
    .await;
    let s = Setup::new("ex-punctuated", 1).await;
    let watermarks = format!("{}.watermarks", s.output);
    let metrics_port = free_port();
    let env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", s.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", s.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", s.group.clone()),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        // Each watch ends after its first poll, so only the markers move the watermark.
        ("WATCHBRIDGE_TERMINATION", "polls(1)".into()),
        // The input never counts as idle here: it constrains the watermark throughout.
        ("WATCHBRIDGE_IDLE_TIMEOUT", "10m".into()),
        (
            "WATCHBRIDGE_METRICS_ADDR",
            format!("127.0.0.1:{metrics_port}"),
        ),
        ("WATCHBRIDGE_LOG", LOG_WATCH_ENDS.into()),
    ];
    let mut bridge = Bridge::start_program(&example("punctuated_watermarks"), &env);
    let b = broker();
    let now = now_ms();
    let (first, second, lower) = (now - 2 * 3_600_000, now - 3_600_000, now - 3 * 3_600_000);
    let marker = |t: i64| json!({ "watermark": t }).to_string();
    let user = |u: i64| json!({ "id": u }).to_string();

    b.produce(
        &s.input,
        Some(0),
        Some(b"marker-1"),
        marker(first).as_bytes(),
        &[],
    )
    .await;
    wait_for_watermark(&bridge, &watermarks, first).await;
    // Inputs timestamped now, hours past the marker.
    for u in [1, 2] {
        let key = format!("user-{u}");
        b.produce(
            &s.input,
            Some(0),
            Some(key.as_bytes()),
            user(u).as_bytes(),
            &[],
        )
        .await;
    }
    bridge.wait_for_log_count("reason=polls", 2, Duration::from_secs(30));
    b.produce(
        &s.input,
        Some(0),
        Some(b"marker-2"),
        marker(second).as_bytes(),
        &[],
    )
    .await;
    wait_for_watermark(&bridge, &watermarks, second).await;
    b.produce(
        &s.input,
        Some(0),
        Some(b"marker-3"),
        marker(lower).as_bytes(),
        &[],
    )
    .await;
    b.produce(&s.input, Some(0), Some(b"user-3"), user(3).as_bytes(), &[])
        .await;
    // User 3's watch came after the lower marker: it has been read.
    bridge.wait_for_log_count("reason=polls", 3, Duration::from_secs(30));
    let ops = Ops::new(metrics_port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let skipped = ops.metric("watchbridge_inputs_skipped_total").await;
        if skipped == Some(3.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "watchbridge_inputs_skipped_total is {skipped:?}, not 3"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past a few watermark intervals (100 ms): a value the lower marker or the ordinary
    // inputs caused would be published by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());

    let values = partition_watermarks(&watermarks).await;
    assert_eq!(
        values.first(),
        Some(&first),
        "the first value is the first marker's: {values:?}"
    );
    assert_eq!(
        values.iter().copied().collect::<BTreeSet<i64>>(),
        BTreeSet::from([first, second]),
        "every value is a marker's, the highest the second's: {values:?}\n{}",
        bridge.log()
    );
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "never back: {values:?}"
    );

    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&outputs),
        ["u1-a", "u2-a", "u3-a"],
        &format!(
            "one output per ordinary input, none for a marker\n{}",
            bridge.log()
        ),
    );
    let dead = b.read_to_end(&s.dlq).await;
    assert!(
        dead.is_empty(),
        "no dead letter: {:?}",
        dead.iter().map(record_key).collect::<Vec<_>>()
    );
    let paths: BTreeSet<String> = server.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        paths,
        BTreeSet::from(["/users/1".into(), "/users/2".into(), "/users/3".into()]),
        "markers are never polled"
    );
}

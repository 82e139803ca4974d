//! The object-store poller against a real S3-API server: moto in server mode
//! (`support::moto_process`), reached directly or through a recording proxy that can also
//! throttle (`support::s3_proxy`).

mod support;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::moto_process::{Auth, MotoProcess};
use support::s3_proxy::{Mode, S3Proxy};
use watchbridge::poll::{PollResult, Poller};
use watchbridge::pollers::object_store::{ObjectArgs, ObjectStorePoller, ObjectTarget};
use watchbridge::pollers::Resolve;

const TIMEOUT: Duration = Duration::from_secs(20);

/// What to set over the environment: moto's endpoint over plain http, any key.
fn options(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("aws_endpoint", endpoint.to_string()),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "test".into()),
        ("aws_secret_access_key", "test".into()),
        ("aws_region", "us-east-1".into()),
    ]
}

fn poller_with(
    endpoint: &str,
    args: ObjectArgs,
    timeout: Duration,
    extra: &[(&'static str, &str)],
) -> ObjectStorePoller {
    let mut opts = options(endpoint);
    for (k, v) in extra {
        opts.retain(|(key, _)| key != k);
        opts.push((k, v.to_string()));
    }
    let opts: Vec<(&str, &str)> = opts.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ObjectStorePoller::with_options(args.config(timeout).unwrap(), &opts).unwrap()
}

fn args(url: &str) -> ObjectArgs {
    ObjectArgs {
        object_url: Some(url.to_string()),
        ..ObjectArgs::default()
    }
}

/// A client of the bucket that writes the test's objects, straight to moto.
fn writer(moto: &MotoProcess, bucket: &str) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(moto.url())
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_region("us-east-1")
        .build()
        .unwrap()
}

async fn put(store: &AmazonS3, key: &str, body: &'static [u8]) {
    store
        .put(&Path::from(key), PutPayload::from_static(body))
        .await
        .unwrap();
}

fn target(poller: &ObjectStorePoller, input: Value) -> Arc<ObjectTarget> {
    Arc::new(poller.resolve(&input, b"k").unwrap())
}

fn keys(r: &PollResult) -> Vec<String> {
    r.outputs
        .iter()
        .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
        .collect()
}

/// Only `LIST` requests (`GET /bucket?list-type=2…`) and `HEAD`s of the proxy's log.
fn listings(proxy: &S3Proxy) -> Vec<String> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| r.contains("list-type=2"))
        .collect()
}

#[tokio::test]
async fn each_object_under_the_prefix_once_with_its_metadata_and_the_marker_ends_it() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("data");
    let w = writer(&moto, "data");
    let mut a = args("s3://data/tenants/{/tenant}/");
    a.object_done_marker = Some("_SUCCESS".into());
    let p = poller_with(&moto.url(), a, TIMEOUT, &[]);
    let t = target(&p, json!({"tenant": "acme"}));

    let r = p.poll(t.clone()).await.unwrap();
    assert!(r.outputs.is_empty() && !r.complete, "{r:?}");

    put(&w, "tenants/acme/2026/a.csv", b"12345").await;
    put(&w, "tenants/acme/b.csv", b"x").await;
    // Not under the prefix: a sibling whose name starts the same, another tenant.
    put(&w, "tenants/acmecorp/c.csv", b"x").await;
    put(&w, "tenants/other/d.csv", b"x").await;
    let r = p.poll(t.clone()).await.unwrap();
    assert_eq!(keys(&r), ["tenants/acme/2026/a.csv", "tenants/acme/b.csv"]);
    assert!(!r.complete);
    let v: Value = serde_json::from_slice(&r.outputs[0].value).unwrap();
    assert_eq!(v["location"], "tenants/acme/2026/a.csv");
    assert_eq!(v["url"], "s3://data/tenants/acme/2026/a.csv");
    assert_eq!(v["size"], 5);
    assert!(v["e_tag"].as_str().is_some_and(|t| t.len() > 8), "{v}");
    let modified =
        watchbridge::pollers::event_time::parse_rfc3339(v["last_modified"].as_str().unwrap())
            .unwrap();
    assert_eq!(r.outputs[0].event_time, modified);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now - modified).abs() < 120_000,
        "event time is the object's: {modified}"
    );

    put(&w, "tenants/acme/_SUCCESS", b"").await;
    let r = p.poll(t.clone()).await.unwrap();
    assert!(r.complete, "the marker makes the set final");
    assert_eq!(
        keys(&r),
        ["tenants/acme/2026/a.csv", "tenants/acme/b.csv"],
        "the marker is not an output"
    );
}

#[tokio::test]
async fn a_rewritten_object_is_new_with_match_updated_and_not_without() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("data");
    let w = writer(&moto, "data");
    let plain = poller_with(&moto.url(), args("s3://data/in/"), TIMEOUT, &[]);
    let mut a = args("s3://data/in/");
    a.object_match_updated = true;
    let updated = poller_with(&moto.url(), a, TIMEOUT, &[]);
    let (tp, tu) = (target(&plain, json!({})), target(&updated, json!({})));

    put(&w, "in/x", b"one").await;
    let before = (
        keys(&plain.poll(tp.clone()).await.unwrap()),
        keys(&updated.poll(tu.clone()).await.unwrap()),
    );
    put(&w, "in/x", b"two").await;
    let after = (
        keys(&plain.poll(tp.clone()).await.unwrap()),
        keys(&updated.poll(tu.clone()).await.unwrap()),
    );
    assert_eq!(before.0, ["in/x"]);
    assert_eq!(after.0, before.0, "without match-updated: the same output");
    assert!(before.1[0].starts_with("in/x@"), "{before:?}");
    assert_ne!(after.1, before.1, "with match-updated: a new key (ETag)");
}

#[tokio::test]
async fn an_input_cannot_leave_its_prefix() {
    let moto = MotoProcess::start(Auth::Any);
    let p = poller_with(
        &moto.url(),
        args("s3://data/tenants/{/tenant}/in/"),
        TIMEOUT,
        &[],
    );
    for bad in ["..", "../other", "a/b", "", ".", "x/../../y"] {
        let e = p.resolve(&json!({"tenant": bad}), b"k").unwrap_err();
        assert!(e.to_string().contains("one path segment"), "{bad:?}: {e}");
    }
    let t = p.resolve(&json!({"tenant": "a b%"}), b"k").unwrap();
    assert!(
        t.prefix().as_ref().starts_with("tenants/"),
        "{}",
        t.prefix()
    );
    assert!(t.prefix().as_ref().ends_with("/in"), "{}", t.prefix());
    assert_eq!(t.prefix().parts().count(), 3);
}

#[tokio::test]
async fn throttling_is_a_transient_error_that_honours_retry_after() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("data");
    let proxy = S3Proxy::start(&moto.url()).await;
    let p = poller_with(&proxy.url(), args("s3://data/in/"), TIMEOUT, &[]);
    let t = target(&p, json!({}));
    proxy.set_mode(Mode::SlowDown(Some(7)));
    let e = p.poll(t.clone()).await.unwrap_err();
    assert_eq!(e.kind, "throttled", "{e}");
    assert!(!e.permanent);
    assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
    assert!(e.message.contains("SlowDown"), "{e}");
    assert_eq!(
        proxy.requests().len(),
        1,
        "no retries of its own: the engine backs off"
    );
    proxy.set_mode(Mode::SlowDown(None));
    let e = p.poll(t.clone()).await.unwrap_err();
    assert_eq!((e.kind, e.retry_after), ("throttled", None));
    proxy.set_mode(Mode::Forward);
    assert!(p.poll(t).await.is_ok());
}

#[tokio::test]
async fn refused_credentials_and_a_missing_bucket_are_named() {
    let moto = MotoProcess::start(Auth::Iam);
    let p = poller_with(
        &moto.url(),
        args("s3://data/in/"),
        TIMEOUT,
        &[("aws_access_key_id", "AKIANOTKNOWN")],
    );
    let e = p.poll(target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "auth", "{e}");
    assert!(e.message.contains("AWS_ACCESS_KEY_ID"), "{e}");
    assert!(e.message.contains("InvalidAccessKeyId"), "{e}");

    let open = MotoProcess::start(Auth::Any);
    let p = poller_with(&open.url(), args("s3://no-such-bucket/in/"), TIMEOUT, &[]);
    let e = p.poll(target(&p, json!({}))).await.unwrap_err();
    assert_eq!(e.kind, "no_bucket", "{e}");
    assert!(e.message.contains("does not exist"), "{e}");
}

#[tokio::test]
async fn increasing_names_after_a_restart_list_only_the_new_objects() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("logs");
    let w = writer(&moto, "logs");
    let proxy = S3Proxy::start(&moto.url()).await;
    let mut a = args("s3://logs/app/");
    a.object_increasing_names = true;
    let p = poller_with(&proxy.url(), a.clone(), TIMEOUT, &[]);
    for i in 0..5 {
        put(&w, &format!("app/2026-12-03T00:00:0{i}.log"), b"x").await;
    }
    let t = target(&p, json!({}));
    assert_eq!(p.poll(t.clone()).await.unwrap().outputs.len(), 5);
    let saved = p.resume_state(&t).expect("the last key is saved");

    // A new process: a new poller and watch, given the saved state.
    let p = poller_with(&proxy.url(), a, TIMEOUT, &[]);
    let t = target(&p, json!({}));
    p.resume(&t, &saved);
    put(&w, "app/2026-12-03T00:00:05.log", b"x").await;
    put(&w, "app/2026-12-03T00:00:06.log", b"x").await;
    proxy.clear();
    let r = p.poll(t.clone()).await.unwrap();
    assert_eq!(
        keys(&r),
        ["app/2026-12-03T00:00:05.log", "app/2026-12-03T00:00:06.log"]
    );
    let lists = listings(&proxy);
    assert_eq!(
        proxy.requests().len(),
        1,
        "one request: {:?}",
        proxy.requests()
    );
    assert!(
        lists[0].contains("start-after=app%2F2026-12-03T00%3A00%3A04.log"),
        "{lists:?}"
    );
    proxy.clear();
    assert!(p.poll(t).await.unwrap().outputs.is_empty());
    assert_eq!(listings(&proxy).len(), 1);
}

/// 1,500 objects are two pages (S3 gives 1,000 keys a page); the second is held past the
/// poll's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_cut_by_the_deadline_gives_what_it_listed_and_is_never_final() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("big");
    let w = Arc::new(writer(&moto, "big"));
    let names: Vec<String> = (0..1500).map(|i| format!("p/{i:05}")).collect();
    futures::future::join_all(names.chunks(100).map(|chunk| {
        let w = w.clone();
        let chunk = chunk.to_vec();
        async move {
            for key in chunk {
                put(&w, &key, b"x").await;
            }
        }
    }))
    .await;
    put(&w, "p/_SUCCESS", b"").await;
    let proxy = S3Proxy::start(&moto.url()).await;
    let mut a = args("s3://big/p/");
    a.object_done_marker = Some("_SUCCESS".into());
    // A listing stops at 0.8 of the poll timeout: 2.4 s.
    let p = poller_with(&proxy.url(), a, Duration::from_secs(3), &[]);
    let t = target(&p, json!({}));

    // The marker's HEAD and the first page at once; the second page after 10 s.
    proxy.set_mode(Mode::SlowAfter {
        fast: 2,
        delay: Duration::from_secs(10),
    });
    let r = p.poll(t.clone()).await.unwrap();
    assert_eq!(r.outputs.len(), 1000, "the first page");
    assert!(!r.complete, "the marker exists, but the listing was cut");

    proxy.set_mode(Mode::Forward);
    proxy.clear();
    let r = p.poll(t.clone()).await.unwrap();
    assert_eq!(r.outputs.len(), 500, "the rest, after the last key listed");
    assert_eq!(keys(&r)[0], "p/01000");
    assert!(
        !r.complete,
        "a continuation: the part before it was listed before the marker was seen"
    );
    assert!(
        listings(&proxy)[0].contains("start-after=p%2F00999"),
        "{:?}",
        proxy.requests()
    );

    let r = p.poll(t).await.unwrap();
    assert_eq!(r.outputs.len(), 1500);
    assert!(r.complete, "a whole listing after the marker");
}

/// The `watchbridge` binary with `WATCHBRIDGE_POLLER=object_store`, its store set up from
/// the standard AWS_* variables (moto's endpoint over plain http), against the test broker:
/// objects written while the watch runs reach the output topic once each, across polls
/// that list them again and again, and the done marker ends the watch.
#[tokio::test(flavor = "multi_thread")]
async fn through_the_bridge_each_object_reaches_the_output_topic_once() {
    use support::bridge::Bridge;
    use support::kafka::broker;
    use support::scenario::{
        assert_each_once, output_key_counts, outputs_to_end, wait_for_outputs, Setup,
    };

    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("drops");
    let w = writer(&moto, "drops");
    put(&w, "tenants/acme/001.csv", b"a").await;
    put(&w, "tenants/acme/002.csv", b"b").await;
    put(&w, "tenants/other/001.csv", b"x").await;

    let s = Setup::new("objects", 1).await;
    let env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", s.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", s.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", s.group.clone()),
        ("WATCHBRIDGE_POLLER", "object_store".into()),
        (
            "WATCHBRIDGE_OBJECT_URL",
            "s3://drops/tenants/{/tenant}/".into(),
        ),
        ("WATCHBRIDGE_OBJECT_DONE_MARKER", "_SUCCESS".into()),
        ("AWS_ENDPOINT_URL", moto.url()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        (
            "WATCHBRIDGE_LOG",
            "info,librdkafka=warn,rdkafka=warn,watchbridge::internal_events=debug".into(),
        ),
    ];
    let mut bridge = Bridge::start(&env);
    broker()
        .produce(&s.input, None, Some(b"acme"), br#"{"tenant":"acme"}"#, &[])
        .await;
    let first = wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    put(&w, "tenants/acme/003.csv", b"c").await;
    wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    // Many polls (every 200 ms) list all three again before the marker ends the watch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    put(&w, "tenants/acme/_SUCCESS", b"").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !bridge.log().contains("reason=final") {
        assert!(std::time::Instant::now() < deadline, "{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    let all = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&all),
        [
            "tenants/acme/001.csv",
            "tenants/acme/002.csv",
            "tenants/acme/003.csv",
        ],
        &bridge.log(),
    );
    for m in &first {
        use rdkafka::Message;
        let v: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        let modified =
            watchbridge::pollers::event_time::parse_rfc3339(v["last_modified"].as_str().unwrap())
                .unwrap();
        assert_eq!(
            m.timestamp().to_millis(),
            Some(modified),
            "timestamp = last modified"
        );
        assert_eq!(m.key(), Some(&b"acme"[..]), "key = watch key");
    }
}

/// `watchbridge poll-once` with the object-store poller prints each object as a JSON line;
/// a bad setting is named at start.
#[tokio::test]
async fn poll_once_lists_the_prefix_and_bad_settings_are_named() {
    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("drops");
    let w = writer(&moto, "drops");
    put(&w, "in/acme/a.csv", b"a").await;
    put(&w, "in/acme/_SUCCESS", b"").await;
    let run = |url: &str| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_watchbridge"));
        for (name, _) in std::env::vars() {
            if name.starts_with("WATCHBRIDGE_") || name.starts_with("AWS_") {
                command.env_remove(name);
            }
        }
        command
            .args(["poll-once", "--input", r#"{"t":"acme"}"#])
            .env("WATCHBRIDGE_POLLER", "object_store")
            .env("WATCHBRIDGE_OBJECT_URL", url)
            .env("WATCHBRIDGE_OBJECT_DONE_MARKER", "_SUCCESS")
            .env("AWS_ENDPOINT", moto.url())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .output()
            .unwrap()
    };
    let out = run("s3://drops/in/{/t}/");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("in/acme/a.csv"), "{stdout}");
    assert!(stderr.contains("complete true"), "{stderr}");

    let out = run("s3://{/t}/in/");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WATCHBRIDGE_OBJECT_URL: "), "{stderr}");
}

/// With increasing names, the bridge saves the last key listed with the watch's state: after
/// a kill, the restored watch's first listing starts after it, and each object reaches the
/// output topic once across the kill.
#[tokio::test(flavor = "multi_thread")]
async fn through_the_bridge_a_restart_lists_only_after_the_saved_key() {
    use support::bridge::Bridge;
    use support::kafka::broker;
    use support::scenario::{
        assert_each_once, output_key_counts, outputs_to_end, wait_for_outputs, Setup,
    };

    let moto = MotoProcess::start(Auth::Any);
    moto.create_bucket("logs");
    let w = writer(&moto, "logs");
    for i in 1..=3 {
        put(&w, &format!("app/{i:03}.log"), b"x").await;
    }
    let proxy = S3Proxy::start(&moto.url()).await;
    let s = Setup::new("objects-restart", 1).await;
    let env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", s.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", s.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", s.group.clone()),
        ("WATCHBRIDGE_POLLER", "object_store".into()),
        ("WATCHBRIDGE_OBJECT_URL", "s3://logs/{/app}/".into()),
        ("WATCHBRIDGE_OBJECT_INCREASING_NAMES", "true".into()),
        ("AWS_ENDPOINT_URL", proxy.url()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        // The restart after the kill gets the partition once the killed member's session
        // has timed out: 6 s, not the default 45 s that would leave little of the 60 s wait.
        ("KAFKA_SESSION_TIMEOUT_MS", "6000".into()),
    ];
    let mut bridge = Bridge::start(&env);
    broker()
        .produce(&s.input, None, Some(b"app"), br#"{"app":"app"}"#, &[])
        .await;
    wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    // A few more polls (every 200 ms), and checkpoints (every 500 ms) to save the key.
    let polled = listings(&proxy).len();
    while listings(&proxy).len() < polled + 5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    bridge.child.kill().unwrap();
    bridge.child.wait().unwrap();
    let before = listings(&proxy);
    assert!(
        !before[0].contains("start-after")
            && before[1..]
                .iter()
                .all(|l| l.contains("start-after=app%2F003.log")),
        "the first lists everything, the others after the last key: {before:?}"
    );

    put(&w, "app/004.log", b"x").await;
    put(&w, "app/005.log", b"x").await;
    proxy.clear();
    let mut bridge = Bridge::start(&env);
    wait_for_outputs(&s.output, 5, Duration::from_secs(60)).await;
    let after = listings(&proxy);
    assert!(
        after[0].contains("start-after=app%2F003.log"),
        "the restored watch lists after the saved key: {after:?}\n{}",
        bridge.log()
    );
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let all = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&all),
        (1..=5).map(|i| format!("app/{i:03}.log")),
        &format!("each object once across the kill\n{}", bridge.log()),
    );
}

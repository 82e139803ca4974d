//! Operating individual watches through the operations server (`GET /watches`, `GET
//! /partitions`, `POST /watches/{key}/stop`, `POST /pause`, `POST /resume`): the real binary
//! against the test broker, one instance and two.

mod support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::broker_process::free_port;
use support::http_server::TestServer;
use support::ops_client::Ops;
use support::scenario::{
    assert_each_once, feeds, output_key_counts, outputs_to_end, produce_user_to, user_output_keys,
    wait_for_outputs, Setup,
};

const TOKEN: &str = "s3cret-admin";

/// The settings of one instance: watches that never end (the feeds are not final), polled
/// every 200 ms, control on with [`TOKEN`], the operations server on `port`.
fn env(s: &Setup, server: &TestServer, port: u16) -> Vec<(&'static str, String)> {
    let mut env = s.env(server);
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    // The control API on the same port (it is on loopback apart from the metrics unless
    // told), with its token.
    env.push(("WATCHBRIDGE_CONTROL_ADDR", format!("127.0.0.1:{port}")));
    env.push(("WATCHBRIDGE_ADMIN_TOKEN", TOKEN.into()));
    // A takeover after a SIGKILL waits for the session to expire.
    env.push(("KAFKA_SESSION_TIMEOUT_MS", "6000".into()));
    env.push(("KAFKA_HEARTBEAT_INTERVAL_MS", "1000".into()));
    env
}

/// Requests the feed server saw for `user`.
fn polls_of(server: &TestServer, user: i64) -> usize {
    let path = format!("/users/{user}/events");
    server
        .requests()
        .iter()
        .filter(|s| s.target.starts_with(&path))
        .count()
}

async fn json(ops: &Ops, path: &str) -> (u16, Value) {
    let (status, body) = ops.get(path).await.expect("the operations server answers");
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, value)
}

/// Wait until `GET path` answers `status` (or panic with the bridge's log).
async fn wait_for_status(ops: &Ops, bridge: &Bridge, path: &str, status: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((got, body)) = ops.get(path).await {
            if got == status {
                return serde_json::from_str(&body).unwrap_or(Value::Null);
            }
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {status}; log:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn status_stop_and_pause_of_the_watches_of_one_instance() {
    let s = Setup::new("control-one", 2).await;
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let port = free_port();
    let bridge = Bridge::start(&env(&s, &server, port));
    let ops = Ops::with_token(port, TOKEN);
    produce_user_to(&s.input, Some(0), 1).await;
    produce_user_to(&s.input, Some(1), 2).await;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;

    // One watch, in full.
    let w = wait_for_status(&ops, &bridge, "/watches/user-1", 200).await;
    assert_eq!(w["key"], "user-1");
    assert_eq!(w["partition"], 0);
    assert_eq!(w["seen_outputs"], 2, "{w}");
    assert!(w["polls_ok"].as_u64().unwrap() >= 1, "{w}");
    assert_eq!(w["failures_in_a_row"], 0);
    assert_eq!(w["last_error"], Value::Null);
    assert_eq!(w["termination"], "never");
    assert_eq!(w["input"]["key"], "user-1", "{w}");
    // The input's value (often personal data) only with WATCHBRIDGE_CONTROL_SHOW_INPUTS.
    assert_eq!(w["input"]["value"], Value::Null, "{w}");
    assert!(w["input"]["value_hidden"].is_string(), "{w}");
    assert_eq!(w["paused"], false, "{w}");
    // Reads of the control API need the token too.
    assert_eq!(Ops::new(port).get("/watches").await.unwrap().0, 401);
    assert_eq!(w["last_poll_result"], "ok", "{w}");
    let last_poll = w["last_poll_ms"].as_i64().expect("a last poll time");
    let started = w["started_ms"].as_i64().unwrap();
    assert!(
        (started - 1_000..=support::scenario::now_ms()).contains(&last_poll),
        "{w}"
    );
    assert!(
        ["waiting", "polling"].contains(&w["state"].as_str().unwrap()),
        "{w}"
    );
    // The key as a path segment, percent-encoded.
    assert_eq!(json(&ops, "/watches/user%2D1").await.0, 200);
    // A key not live here: where this instance's watches are.
    let (status, missing) = json(&ops, "/watches/user-9").await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["owned_partitions"], serde_json::json!([0, 1]));

    // The list, its filters and paging; the partitions.
    let (_, all) = json(&ops, "/watches").await;
    assert_eq!(all["total"], 2, "{all}");
    let keys: Vec<&str> = all["watches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["user-1", "user-2"]);
    let (_, p1) = json(&ops, "/watches?partition=1&limit=10").await;
    assert_eq!(p1["total"], 1);
    assert_eq!(p1["watches"][0]["key"], "user-2");
    let (_, paged) = json(&ops, "/watches?offset=1&limit=1").await;
    assert_eq!(paged["watches"][0]["key"], "user-2");
    assert_eq!(json(&ops, "/watches?state=sleeping").await.0, 400);
    let (_, partitions) = json(&ops, "/partitions").await;
    let partitions = partitions.as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{partitions:?}");
    assert_eq!(partitions[0]["live_watches"], 1);
    assert_eq!(partitions[0]["recovering"], false);
    assert_eq!(partitions[0]["lowest_hold"]["key"], "user-1");

    // Control needs the token.
    assert_eq!(ops.post("/pause", None).await.unwrap().0, 401);
    assert_eq!(ops.post("/pause", Some("wrong")).await.unwrap().0, 401);
    assert_eq!(ops.post("/watches/user-1/stop", None).await.unwrap().0, 401);

    // Paused: nothing polls, inputs still start watches, nothing is lost.
    let (status, body) = ops.post("/pause", Some(TOKEN)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = (polls_of(&server, 1), polls_of(&server, 2));
    produce_user_to(&s.input, Some(0), 3).await;
    let w3 = wait_for_status(&ops, &bridge, "/watches/user-3", 200).await;
    assert_eq!(w3["polls_ok"], 0, "{w3}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (
            polls_of(&server, 1),
            polls_of(&server, 2),
            polls_of(&server, 3)
        ),
        (before.0, before.1, 0),
        "polled while paused"
    );
    assert_eq!(ops.metric("watchbridge_polling_paused").await, Some(1.0));
    assert_eq!(ops.post("/resume", Some(TOKEN)).await.unwrap().0, 200);
    wait_for_outputs(&s.output, 6, Duration::from_secs(30)).await;
    assert!(
        polls_of(&server, 1) > before.0,
        "not polled again after the resume"
    );

    // Stopped: durably, so a restart and the input delivered again do not start it.
    let (status, body) = ops.post("/watches/user-1/stop", Some(TOKEN)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    // Ended, and why: stopped.
    let (status, ended) = json(&ops, "/watches/user-1").await;
    assert_eq!(status, 200, "{ended}");
    assert_eq!(
        (&ended["state"], &ended["reason"]),
        (&"finished".into(), &"stopped".into())
    );
    assert_eq!(ended["partition"], 0);
    let (_, finished) = json(&ops, "/watches?state=finished").await;
    assert_eq!(finished["total"], 1, "{finished}");
    assert_eq!(finished["watches"][0]["key"], "user-1");
    let (_, live) = json(&ops, "/watches").await;
    assert_eq!(live["total"], 2, "the live ones: {live}");
    assert_eq!(
        ops.post("/watches/user-1/stop", Some(TOKEN))
            .await
            .unwrap()
            .0,
        404
    );
    // Its finished record reaches the state topic at a checkpoint.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut bridge = bridge;
    let _ = bridge.child.kill();
    let _ = bridge.child.wait();
    let polled_before_restart = polls_of(&server, 1);

    let bridge = Bridge::start(&env(&s, &server, port));
    wait_for_status(&ops, &bridge, "/watches/user-2", 200).await;
    produce_user_to(&s.input, Some(0), 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, after) = json(&ops, "/watches/user-1").await;
    assert_eq!(after["state"], "finished", "started again: {after}");
    assert_eq!(after["reason"], "stopped", "{after}");
    assert_eq!(
        polls_of(&server, 1),
        polled_before_restart,
        "a stopped watch was polled after the restart"
    );
    let mut bridge = bridge;
    bridge.terminate();

    let outputs = outputs_to_end(&s.output).await;
    let counts = output_key_counts(&outputs);
    assert_each_once(&counts, user_output_keys([1, 2, 3]), &bridge.log());
    let log = bridge.log();
    assert!(!log.contains(TOKEN), "the token was logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_answer_where_a_watch_lives_and_a_stop_survives_a_takeover() {
    let s = Setup::new("control-two", 2).await;
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let (port_a, port_b) = (free_port(), free_port());
    let a = Bridge::start(&env(&s, &server, port_a));
    let b = Bridge::start(&env(&s, &server, port_b));
    let (ops_a, ops_b) = (
        Ops::with_token(port_a, TOKEN),
        Ops::with_token(port_b, TOKEN),
    );
    // Each owns one partition once the group has settled.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let owned = |v: Value| v.as_array().map_or(0, Vec::len);
        let (_, pa) = json(&ops_a, "/partitions").await;
        let (_, pb) = json(&ops_b, "/partitions").await;
        if owned(pa) == 1 && owned(pb) == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), b.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    produce_user_to(&s.input, Some(0), 1).await;
    produce_user_to(&s.input, Some(1), 2).await;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;

    // user-1 lives in partition 0: its owner answers, the other from the state topic.
    let (_, pa) = json(&ops_a, "/partitions").await;
    let a_owns_0 = pa[0]["partition"] == 0;
    let (owner, other, mut owner_bridge, other_bridge) = match a_owns_0 {
        true => (&ops_a, &ops_b, a, b),
        false => (&ops_b, &ops_a, b, a),
    };
    let w = wait_for_status(owner, &owner_bridge, "/watches/user-1", 200).await;
    assert_eq!(w["partition"], 0);
    let elsewhere = wait_for_status(other, &other_bridge, "/watches/user-1", 200).await;
    assert_eq!(elsewhere["partition"], 0, "{elsewhere}");
    assert_eq!(elsewhere["state"], "live", "{elsewhere}");
    assert!(elsewhere["answered_from"].is_string(), "{elsewhere}");
    assert_eq!(json(other, "/watches/user-2").await.0, 200);
    // A key no instance has: where it would live.
    let (status, nowhere) = json(other, "/watches/user-9").await;
    assert_eq!(status, 404, "{nowhere}");
    assert_eq!(nowhere["owned_partitions"], serde_json::json!([1]));
    assert!(nowhere["input_partition"]["crc32"].is_u64(), "{nowhere}");
    // A watch whose input went where librdkafka's default partitioner put its key (as
    // every input of `watchbridge produce` does): the instance that does not own it finds
    // it in the partition that is.
    support::kafka::broker()
        .produce(&s.input, None, Some(b"user-5"), br#"{"id": 5}"#, &[])
        .await;
    wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    // Whichever owns it answers from the watch; the other, once the watch's first
    // checkpoint is on the state topic, from there.
    let on_owner = json(owner, "/watches/user-5").await;
    let (lives, asker, asker_bridge) =
        match on_owner.0 == 200 && on_owner.1["answered_from"].is_null() {
            true => (on_owner.1, other, &other_bridge),
            false => (json(other, "/watches/user-5").await.1, owner, &owner_bridge),
        };
    assert!(lives["answered_from"].is_null(), "{lives}");
    let asked = wait_for_status(asker, asker_bridge, "/watches/user-5", 200).await;
    assert_eq!(asked["partition"], lives["partition"], "{asked}");

    // Stopped on its owner, which is then killed: the other instance takes partition 0
    // over, and the watch stays stopped there, its input delivered again or not.
    assert_eq!(
        owner
            .post("/watches/user-1/stop", Some(TOKEN))
            .await
            .unwrap()
            .0,
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = owner_bridge.child.kill();
    let _ = owner_bridge.child.wait();
    let polled = polls_of(&server, 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, partitions) = json(other, "/partitions").await;
        let all = partitions.as_array().unwrap();
        if all.len() == 2 && all.iter().all(|p| p["recovering"] == false) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", other_bridge.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    produce_user_to(&s.input, Some(0), 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, taken_over) = json(other, "/watches/user-1").await;
    assert_eq!(taken_over["state"], "finished", "{taken_over}");
    assert_eq!(taken_over["reason"], "stopped", "{taken_over}");
    assert_eq!(
        polls_of(&server, 1),
        polled,
        "the stopped watch polled again"
    );
    assert_eq!(json(other, "/watches/user-2").await.0, 200);
    let mut other_bridge = other_bridge;
    other_bridge.terminate();
    let counts = output_key_counts(&outputs_to_end(&s.output).await);
    assert_each_once(&counts, user_output_keys([1, 2, 5]), &other_bridge.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poll_now_moves_a_waiting_watch_up() {
    let s = Setup::new("control-poll", 1).await;
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let port = free_port();
    let mut settings = env(&s, &server, port);
    // Without a poll-now, the second poll would be an hour away.
    settings.push(("WATCHBRIDGE_POLL_INTERVAL", "1h".into()));
    let bridge = Bridge::start(&settings);
    let ops = Ops::with_token(port, TOKEN);
    produce_user_to(&s.input, Some(0), 4).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    let w = wait_for_status(&ops, &bridge, "/watches/user-4", 200).await;
    assert_eq!(w["state"], "waiting", "{w}");
    assert_eq!(polls_of(&server, 4), 1);
    assert_eq!(
        ops.post("/watches/user-4/poll", None).await.unwrap().0,
        401,
        "a poll-now is control"
    );
    let (status, body) = ops.post("/watches/user-4/poll", Some(TOKEN)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while polls_of(&server, 4) < 2 {
        assert!(
            Instant::now() < deadline,
            "not polled now:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once: the timer it replaced does not poll it again, and the next is an hour away.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(polls_of(&server, 4), 2);
    let w = wait_for_status(&ops, &bridge, "/watches/user-4", 200).await;
    assert_eq!(w["polls_ok"], 2, "{w}");
    let next = w["next_poll_ms"].as_i64().unwrap();
    assert!(next - support::scenario::now_ms() > 3_000_000, "{w}");
    assert_eq!(
        ops.post("/watches/user-9/poll", Some(TOKEN))
            .await
            .unwrap()
            .0,
        404
    );
}

/// Polls of each of `users` made so far.
fn polls(server: &TestServer, users: &[i64]) -> Vec<usize> {
    users.iter().map(|u| polls_of(server, *u)).collect()
}

/// Wait until both instances own one partition each and neither is recovering.
async fn settled(a: &Ops, b: &Ops, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = |v: &Value| {
            v.as_array()
                .is_some_and(|p| p.len() == 1 && p[0]["recovering"] == false)
        };
        let (_, pa) = json(a, "/partitions").await;
        let (_, pb) = json(b, "/partitions").await;
        if ready(&pa) && ready(&pb) {
            return;
        }
        assert!(Instant::now() < deadline, "{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pause given to one instance stops the watches of every instance, and holds through a
/// restart of every instance until a resume given to another; a pause of one watch, given
/// to the instance that does not own it, stops that watch only. Nothing is lost meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_given_to_any_instance_holds_on_all_and_survives_their_restarts() {
    let s = Setup::new("control-group-pause", 2).await;
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = Bridge::start(&env(&s, &server, port_a));
    let mut b = Bridge::start(&env(&s, &server, port_b));
    let (ops_a, ops_b) = (
        Ops::with_token(port_a, TOKEN),
        Ops::with_token(port_b, TOKEN),
    );
    settled(&ops_a, &ops_b, || format!("{}\n{}", a.log(), b.log())).await;
    produce_user_to(&s.input, Some(0), 1).await;
    produce_user_to(&s.input, Some(1), 2).await;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;

    // Paused through A: neither instance polls.
    let (status, body) = ops_a.post("/pause", Some(TOKEN)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = polls(&server, &[1, 2]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        polls(&server, &[1, 2]),
        before,
        "polled while the group was paused"
    );
    let (_, orders) = json(&ops_b, "/orders").await;
    assert_eq!(
        orders["paused"], true,
        "B does not know the pause: {orders}"
    );

    // Every instance restarted (a rollout): still paused, and the watches are back.
    a.terminate();
    b.terminate();
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = Bridge::start(&env(&s, &server, port_a));
    let mut b = Bridge::start(&env(&s, &server, port_b));
    let (ops_a, ops_b) = (
        Ops::with_token(port_a, TOKEN),
        Ops::with_token(port_b, TOKEN),
    );
    settled(&ops_a, &ops_b, || format!("{}\n{}", a.log(), b.log())).await;
    let polled = polls(&server, &[1, 2]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        polls(&server, &[1, 2]),
        polled,
        "polled after the restarts: the pause was lost"
    );
    for key in ["user-1", "user-2"] {
        let on_a = json(&ops_a, &format!("/watches/{key}")).await;
        let on_b = json(&ops_b, &format!("/watches/{key}")).await;
        // The owner's answer (the other's comes from the state topic).
        let by_owner =
            |(code, body): &(u16, Value)| *code == 200 && body["answered_from"].is_null();
        let status = if by_owner(&on_a) { on_a.1 } else { on_b.1 };
        assert_eq!(status["paused"], true, "{status}");
    }

    // Resumed through B: both poll again.
    assert_eq!(ops_b.post("/resume", Some(TOKEN)).await.unwrap().0, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while polls(&server, &[1, 2])
        .iter()
        .zip(&polled)
        .any(|(now, then)| now <= then)
    {
        assert!(
            Instant::now() < deadline,
            "not polled after the resume:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // One watch paused, through the instance that does not own it: it alone stops.
    let (_, pa) = json(&ops_a, "/partitions").await;
    let not_owner_of_user_1 = if pa[0]["partition"] == 0 {
        &ops_b
    } else {
        &ops_a
    };
    let (status, body) = not_owner_of_user_1
        .post("/watches/user-1/pause", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let one = polls(&server, &[1, 2]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = polls(&server, &[1, 2]);
    assert_eq!(later[0], one[0], "the paused watch polled");
    assert!(later[1] > one[1], "the other watch stopped polling too");
    assert_eq!(
        not_owner_of_user_1
            .post("/watches/user-1/resume", Some(TOKEN))
            .await
            .unwrap()
            .0,
        200
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while polls_of(&server, 1) <= later[0] {
        assert!(
            Instant::now() < deadline,
            "user-1 not polled after its resume"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A wrong method is told which to use.
    let (status, _) = ops_a.get("/pause").await.unwrap();
    assert_eq!(status, 405);

    produce_user_to(&s.input, Some(0), 3).await;
    wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    a.terminate();
    b.terminate();
    let counts = output_key_counts(&outputs_to_end(&s.output).await);
    assert_each_once(
        &counts,
        user_output_keys([1, 2, 3]),
        &format!("{}\n{}", a.log(), b.log()),
    );
}

/// The feeds of the restart test: user 2's is final at once; users 1 and 3 serve their
/// first event, then fail (phase 1), then serve both events (phase 2).
fn failing_feeds(seen: &support::http_server::Seen, phase: u8) -> support::http_server::Reply {
    let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
    if user == 2 {
        return feeds(seen, true);
    }
    let event = |suffix: &str, ms: i64| serde_json::json!({"id": format!("u{user}-{suffix}"), "at": support::scenario::T0 + user * 1000 + ms});
    match phase {
        0 => support::http_server::Reply::json(
            serde_json::json!({"events": [event("a", 0)], "done": false}),
        ),
        1 => support::http_server::Reply::status(500, "down for maintenance"),
        _ => support::http_server::Reply::json(
            serde_json::json!({"events": [event("a", 0), event("b", 500)], "done": false}),
        ),
    }
}

/// Wait until `GET /watches/{key}` (asked of both instances) says it ended `reason`.
async fn wait_until_ended(a: &Ops, b: &Ops, key: &str, reason: &str, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for ops in [a, b] {
            let (status, w) = json(ops, &format!("/watches/{key}")).await;
            if status == 200 && w["state"] == "finished" && w["reason"] == reason {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key} never ended {reason}:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Failed watches restarted, by key and all at once, and a finished one reset, each asked
/// of the instance that does not own it (any instance takes the order): a restarted watch
/// emits only what is new, a reset one everything again, once.
#[tokio::test(flavor = "multi_thread")]
async fn failed_watches_restart_and_ended_ones_reset_from_any_instance() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let s = Setup::new("control-restart", 2).await;
    let phase = std::sync::Arc::new(AtomicU8::new(0));
    let serving = phase.clone();
    let server =
        TestServer::start(move |seen| failing_feeds(seen, serving.load(Ordering::SeqCst))).await;
    let with = |port| {
        let mut env = env(&s, &server, port);
        env.push(("WATCHBRIDGE_POLL_INTERVAL", "200ms".into()));
        env.push(("WATCHBRIDGE_RETRY_LIMIT", "0".into()));
        env.push(("WATCHBRIDGE_CHECKPOINT_INTERVAL", "200ms".into()));
        env
    };
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = Bridge::start(&with(port_a));
    let mut b = Bridge::start(&with(port_b));
    let (ops_a, ops_b) = (
        Ops::with_token(port_a, TOKEN),
        Ops::with_token(port_b, TOKEN),
    );
    let logs = || format!("{}\n{}", a.log(), b.log());
    settled(&ops_a, &ops_b, logs).await;
    produce_user_to(&s.input, Some(0), 1).await;
    produce_user_to(&s.input, Some(1), 2).await;
    produce_user_to(&s.input, Some(0), 3).await;
    // u1-a, u3-a, u2-a, u2-b; user 2's watch ends `final`.
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    let (_, pa) = json(&ops_a, "/partitions").await;
    let (owner_of_0, other_than_owner_of_0) = if pa[0]["partition"] == 0 {
        (&ops_a, &ops_b)
    } else {
        (&ops_b, &ops_a)
    };

    // A live watch does not restart, nor reset (once its first checkpoint is on the state
    // topic, whence the other instance knows it).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = other_than_owner_of_0
            .post("/watches/user-1/restart", Some(TOKEN))
            .await
            .unwrap();
        if status == 409 {
            break;
        }
        assert_eq!(status, 404, "{body}");
        assert!(Instant::now() < deadline, "{body}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The API is down: users 1 and 3 fail (no retry).
    phase.store(1, Ordering::SeqCst);
    wait_until_ended(&ops_a, &ops_b, "user-1", "failed", logs).await;
    wait_until_ended(&ops_a, &ops_b, "user-3", "failed", logs).await;
    // The instance that does not own them answers from the state topic.
    let (status, remembered) = json(other_than_owner_of_0, "/watches/user-1").await;
    assert_eq!(status, 200, "{remembered}");
    assert_eq!(remembered["reason"], "failed", "{remembered}");
    assert!(remembered["answered_from"].is_string(), "{remembered}");

    // Back up: user 1 restarted by key, through the instance that does not own it.
    phase.store(2, Ordering::SeqCst);
    let (status, body) = other_than_owner_of_0
        .post("/watches/user-1/restart", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    wait_for_outputs(&s.output, 5, Duration::from_secs(60)).await;
    // The state topic learns user 1 is live again at its partition's next checkpoint;
    // until then `/restart` lists it too (and restarting it again would start nothing).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, w) = json(other_than_owner_of_0, "/watches/user-1").await;
        if status == 200 && w["state"] != "finished" {
            break;
        }
        assert!(Instant::now() < deadline, "{w}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every failed watch (user 3's), through the owner this time.
    let (status, body) = owner_of_0.post("/restart", Some(TOKEN)).await.unwrap();
    assert_eq!(status, 202, "{body}");
    let restarted: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        restarted["watches"],
        serde_json::json!(["user-3"]),
        "{body}"
    );
    wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;

    // User 2's watch finished `final`: a restart is refused (it did not fail), a reset
    // needs its confirmation, then emits both events again.
    let (_, pb) = json(&ops_b, "/partitions").await;
    let not_owner_of_1 = if pb[0]["partition"] == 1 {
        &ops_a
    } else {
        &ops_b
    };
    let (status, body) = not_owner_of_1
        .post("/watches/user-2/restart", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 409, "{body}");
    let (status, body) = not_owner_of_1
        .post("/watches/user-2/reset", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = not_owner_of_1
        .post("/watches/user-2/reset?confirm=user-2", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    wait_for_outputs(&s.output, 8, Duration::from_secs(60)).await;
    a.terminate();
    b.terminate();
    let counts = output_key_counts(&outputs_to_end(&s.output).await);
    let expected: std::collections::BTreeMap<String, usize> = [
        ("u1-a", 1),
        ("u1-b", 1),
        ("u3-a", 1),
        ("u3-b", 1),
        ("u2-a", 2),
        ("u2-b", 2),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(counts, expected, "{}\n{}", a.log(), b.log());
}

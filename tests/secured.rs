//! The bridge on a secured Apache Kafka node (issue 47), end to end through
//! `watchbridge run`: it logs in by each mechanism a Kafka user meets — TLS with a private
//! CA, mutual TLS, SASL/SCRAM-SHA-512, SASL/PLAIN and SASL/OAUTHBEARER with OIDC, the last
//! three over TLS — under the standard authorizer, and its outputs are read back by
//! another client. `auto` chooses `exactly_once` there, as on a plaintext listener.

mod support;

use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::scenario::{
    assert_each_once, finished_feeds, output_key_counts, outputs_to_end, produce_user,
    user_output_keys, Setup,
};
use support::secured::{secured, Login};

/// Every ACL a test's bridge could want, on the names its [`Setup`] derives from one
/// prefix: its topics, its group, its transactional ids.
fn everything_on(s: &Setup) -> Vec<String> {
    vec![
        format!("topic {} prefixed all", s.input),
        format!("group {} prefixed all", s.group),
        format!("transactional_id watchbridge-{}- prefixed all", s.group),
    ]
}

/// Wait (90 s at most) until each of `users`' two outputs can be on `output`, stop the
/// bridge, and check it stopped cleanly and wrote each output once: its log. `what` names
/// the run in a failure.
async fn stop_once_all_arrived(
    bridge: &mut Bridge,
    output: &str,
    users: std::ops::RangeInclusive<i64>,
    what: &str,
) -> String {
    let expected = user_output_keys(users);
    let deadline = Instant::now() + Duration::from_secs(90);
    while outputs_to_end(output).await.len() < expected.len() {
        assert!(
            Instant::now() < deadline,
            "{what}: not {} outputs within 90 s: {}",
            expected.len(),
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, _) = bridge.terminate();
    let log = bridge.log();
    // The log's end first: a CI report keeps a failure's first and last lines.
    let end: Vec<&str> = log.lines().rev().take(25).collect();
    assert_eq!(
        code,
        Some(0),
        "{what}: the log's end (latest first):\n{}\nthe whole log: {log}",
        end.join("\n")
    );
    let outputs = outputs_to_end(output).await;
    assert_each_once(&output_key_counts(&outputs), expected, &log);
    log
}

/// Three users' inputs in, each output once, read back over the super user's listener;
/// `auto` chose `exactly_once`; the bridge stopped cleanly.
async fn round_trip(name: &str, login: Login, extra: &[(&'static str, &str)]) {
    let c = secured();
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new(name, 1).await;
    if login != Login::Tls {
        c.acls("add", &login.principal(), &everything_on(&s));
    }
    let mut env = s.env(&server);
    env.extend(c.env(login));
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let mut bridge = Bridge::start(&env);
    for user in 1..=3 {
        produce_user(&s.input, user).await;
    }
    let log = stop_once_all_arrived(&mut bridge, &s.output, 1..=3, name).await;
    assert!(
        log.contains("WATCHBRIDGE_GUARANTEE guarantee=exactly_once"),
        "auto chose exactly_once: {log}"
    );
    for refused in [
        "Authentication failed",
        "authorization failed",
        "SSL handshake failed",
    ] {
        assert!(!log.contains(refused), "{refused}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_a_private_ca() {
    round_trip("tls", Login::Tls, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_the_certificate_is_the_principal() {
    round_trip("mtls", Login::MutualTls, &[]).await;
}

/// Seen failing first (issue 47): the clients the bridge copied its settings into sent
/// rdkafka's placeholder for `sasl.password`, and the input was never read.
#[tokio::test(flavor = "multi_thread")]
async fn scram_sha_512_over_tls() {
    round_trip("scram", Login::Scram, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_over_tls_with_the_password_in_a_file() {
    round_trip("plain", Login::Plain, &[]).await;
}

/// Kerberos: the bridge's key in a keytab, its tickets from a local KDC (librdkafka runs
/// `kinit` with them).
#[tokio::test(flavor = "multi_thread")]
async fn gssapi_kerberos_with_a_keytab() {
    round_trip("krb", Login::Kerberos, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oauthbearer_with_oidc_client_credentials() {
    round_trip("oauth", Login::OAuth, &[]).await;
}

/// KIP-848's consumer group protocol: the broker assigns, the bridge names no assignor.
#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_group_protocol_of_kip_848() {
    round_trip(
        "kip848",
        Login::Scram,
        &[("KAFKA_GROUP_PROTOCOL", "consumer")],
    )
    .await;
}

/// The ACLs docs/brokers.md ("Least privilege") lists for the bridge's principal, on the
/// names of `s`: exactly these, nothing prefixed but the transactional ids. (READ and WRITE
/// imply DESCRIBE.)
fn least_privilege(s: &Setup, exactly_once: bool) -> Vec<String> {
    let state = format!("{}.state", s.group);
    let watermarks = format!("{}.watermarks", s.output);
    let control = format!("{}.control", s.group);
    let mut acls: Vec<String> = [
        (s.input.as_str(), "read"),
        (s.output.as_str(), "write"),
        (s.output.as_str(), "read"),
        (s.dlq.as_str(), "write"),
        (state.as_str(), "read"),
        (state.as_str(), "write"),
        (watermarks.as_str(), "read"),
        (watermarks.as_str(), "write"),
        (control.as_str(), "read"),
        (control.as_str(), "write"),
    ]
    .iter()
    .map(|(topic, operation)| format!("topic {topic} literal {operation}"))
    .collect();
    acls.push(format!("group {} literal read", s.group));
    if exactly_once {
        acls.push(format!(
            "transactional_id watchbridge-{}- prefixed write",
            s.group
        ));
    }
    acls
}

/// Topics made by the test (the bridge is not granted CREATE), ACLs granted but `left_out`,
/// one input produced: the bridge's settings for `mode`, and its operations port.
async fn least_privilege_run(
    name: &str,
    mode: &str,
    left_out: Option<usize>,
    server: &TestServer,
) -> (Setup, Vec<(&'static str, String)>, u16) {
    let c = secured();
    let s = Setup::new(name, 1).await;
    for topic in [
        s.output.clone(),
        s.dlq.clone(),
        format!("{}.watermarks", s.output),
        format!("{}.state", s.group),
        format!("{}.control", s.group),
    ] {
        c.broker.create_topic(&topic, 1).await;
    }
    let acls: Vec<String> = least_privilege(&s, mode == "exactly_once")
        .into_iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != left_out)
        .map(|(_, a)| a)
        .collect();
    c.acls("add", &Login::Scram.principal(), &acls);
    produce_user(&s.input, 1).await;
    let port = support::scenario::free_port();
    let mut env = s.env(server);
    env.extend(c.env(Login::Scram));
    env.extend([
        ("WATCHBRIDGE_GUARANTEE", mode.to_string()),
        ("WATCHBRIDGE_CREATE_TOPICS", "false".to_string()),
        ("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")),
    ]);
    (s, env, port)
}

/// The documented ACLs are enough in both modes: outputs in, each once, no refusal.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_acls_are_enough_in_both_modes() {
    let server = TestServer::start(finished_feeds).await;
    for mode in ["recovery", "exactly_once"] {
        let (s, env, _) = least_privilege_run(&format!("acl-{mode}"), mode, None, &server).await;
        let mut bridge = Bridge::start(&env);
        produce_user(&s.input, 2).await;
        let log = stop_once_all_arrived(&mut bridge, &s.output, 1..=2, mode).await;
        assert!(
            log.contains(&format!("WATCHBRIDGE_GUARANTEE guarantee={mode}")),
            "{log}"
        );
        for refused in ["authorization failed", "refused", "Authorization"] {
            assert!(!log.contains(refused), "{mode}: {refused}: {log}");
        }
    }
}

/// The login refused: the start fails at once saying so, not "cannot reach the brokers"
/// after WATCHBRIDGE_START_TIMEOUT.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_login_fails_the_start_saying_so() {
    let c = secured();
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("badlogin", 1).await;
    let mut env = s.env(&server);
    env.extend(c.env(Login::Scram));
    env.retain(|(k, _)| *k != "KAFKA_SASL_PASSWORD");
    env.push(("KAFKA_SASL_PASSWORD", "not-the-password".into()));
    let started = Instant::now();
    let mut bridge = Bridge::spawn(&env);
    let code = bridge.exit_code(Duration::from_secs(60));
    let log = bridge.log();
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {log}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(log.contains("refused the login"), "{log}");
    assert!(!log.contains("cannot reach the brokers"), "{log}");
    assert!(!log.contains("not-the-password"), "{log}");
}

/// One ACL of the documented set left out (`index` into [`least_privilege`]) of a bridge
/// in `mode`. A start that can check it fails naming the topic; else the partition or the
/// consumer stops with an error naming the resource, `/readyz` says not ready, nothing is
/// dead-lettered (nor, the group refused, committed); once the ACL is granted, the outputs
/// arrive, each once: none was given up.
async fn remove_one(mode: &'static str, index: usize, server: &TestServer) {
    let c = secured();
    let name = format!("rm{index}-{mode}");
    let (s, env, port) = least_privilege_run(&name, mode, Some(index), server).await;
    let acl = least_privilege(&s, mode == "exactly_once")[index].clone();
    let resource = acl.split_whitespace().nth(1).unwrap().to_string();
    let mut bridge = Bridge::spawn(&env);
    produce_user(&s.input, 2).await;
    let ops = support::ops_client::Ops::new(port);
    // The bridge's own line names the resource, or (a transaction's partition refused)
    // librdkafka's ADDPARTS line beside the bridge's "transactions abort again and again";
    // from then on, /readyz must say not ready.
    let named = |log: &str| {
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains(&resource))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut not_ready = None;
    // A refusal met at start (a start that waits is not ready too) ends the process within
    // a moment of its error: looked for once more after the error was seen.
    let mut last_look = false;
    while Instant::now() < deadline && (not_ready.is_none() || !last_look) {
        if not_ready.is_some() {
            last_look = true;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if let Some(status) = bridge.child.try_wait().unwrap() {
            // Refused at start: READ or WRITE missing leaves DESCRIBE missing too (the
            // control topic's READ alone missing: its reading is refused at start).
            let log = bridge.log();
            assert_eq!(status.code(), Some(1), "{acl}: {status:?}: {log}");
            assert!(
                log.contains(&format!("topic `{resource}`"))
                    && (log.contains("DESCRIBE") || log.contains("refused READ")),
                "{acl}: {log}"
            );
            return;
        }
        if not_ready.is_none() && named(&bridge.log()) {
            if let Some((503, body)) = ops.get("/readyz").await {
                not_ready = Some(body);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let log = bridge.log();
    assert!(named(&log), "{acl}: no error names {resource}: {log}");
    assert!(
        not_ready.is_some(),
        "{acl}: /readyz did not say not ready after the error: {log}"
    );
    assert_eq!(
        outputs_to_end(&s.dlq).await.len(),
        0,
        "{acl}: dead letters: {log}"
    );
    // An input is committed once its watch is durable (its outputs are owed by the watch,
    // restored live), so a refused output may leave its input committed: what must hold is
    // that every output arrives once granted (below). A group refused commits nothing.
    if acl.starts_with("group") {
        let committed = c.broker.committed(&s.group, &s.input, 1)[0];
        assert!(
            committed <= 0,
            "{acl}: input committed to {committed}: {log}"
        );
    }
    // Granted: the partition's next try goes through, and the bridge is ready again (the
    // outputs may all have landed before: a stop then must not meet the refusal).
    c.acls("add", &Login::Scram.principal(), std::slice::from_ref(&acl));
    ops.wait_for(&bridge, "/readyz", 200, Duration::from_secs(60))
        .await;
    let log =
        stop_once_all_arrived(&mut bridge, &s.output, 1..=2, &format!("{acl}, granted")).await;
    assert_eq!(
        outputs_to_end(&s.dlq).await.len(),
        0,
        "{acl}: dead letters: {log}"
    );
}

/// Each ACL of the documented set left out in turn (seen failing first: an output refused
/// was dead-lettered and its input committed). Not the READs of the output, state and
/// watermark topics: a first start reads nothing there (their read-backs need them from the
/// first restart on), so their removal shows only later; nor the control topic's WRITE,
/// used only by an operator's order.
#[tokio::test(flavor = "multi_thread")]
async fn each_missing_acl_is_named_and_loses_nothing() {
    let server = TestServer::start(finished_feeds).await;
    let cases = [
        ("recovery", 0),
        ("recovery", 1),
        ("recovery", 3),
        ("recovery", 5),
        ("recovery", 7),
        ("recovery", 8),
        ("recovery", 10),
        ("exactly_once", 1),
        ("exactly_once", 11),
    ];
    for batch in cases.chunks(5) {
        let runs = batch
            .iter()
            .map(|(mode, index)| remove_one(mode, *index, &server));
        futures::future::join_all(runs).await;
    }
}

/// The codecs of the batches in `topic`'s partition 0 log on the node (Kafka's
/// DumpLogSegments), in lower case: e.g. `["zstd"]`.
fn codecs_on_disk(topic: &str) -> Vec<String> {
    let c = secured();
    let libs = support::broker_process::installed_path("kafka.sh", "");
    let log = c
        .broker
        .dir()
        .join(format!("data/{topic}-0/00000000000000000000.log"));
    let out = std::process::Command::new("java")
        .args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(libs.join("*"))
        .args(["kafka.tools.DumpLogSegments", "--files"])
        .arg(&log)
        .output()
        .expect("run DumpLogSegments");
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let mut codecs: Vec<String> = text
        .split("compresscodec: ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|c| c.trim_end_matches(',').to_string())
        .collect();
    codecs.sort();
    codecs.dedup();
    codecs
}

/// Inputs written in each codec are read, and outputs are written in the codec
/// `KAFKA_COMPRESSION_TYPE` names (seen failing first: a build without zstd never read a
/// zstd input, and said so only in librdkafka's log).
#[tokio::test(flavor = "multi_thread")]
async fn inputs_and_outputs_in_every_codec() {
    let c = secured();
    // Records worth compressing: librdkafka sends a batch that does not shrink as it is.
    let pad = "watchbridge ".repeat(200);
    let padded = pad.clone();
    let server = TestServer::start(move |seen| {
        let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
        support::http_server::Reply::json(serde_json::json!({
            "events": [
                {"id": format!("u{user}-a"), "at": 1_700_000_000_000i64 + user * 1000, "pad": padded},
                {"id": format!("u{user}-b"), "at": 1_700_000_000_500i64 + user * 1000, "pad": padded},
            ],
            "done": true,
        }))
    })
    .await;
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    let runs = codecs.iter().map(|out_codec| {
        let server = &server;
        let pad = &pad;
        async move {
            let s = Setup::new(&format!("codec-{out_codec}"), 1).await;
            for (i, in_codec) in codecs.iter().enumerate() {
                let producer: rdkafka::producer::FutureProducer = c
                    .broker
                    .config()
                    .set("compression.type", *in_codec)
                    .create()
                    .unwrap();
                let user = i as i64 + 1;
                let key = format!("user-{user}");
                let value = serde_json::json!({"id": user, "pad": pad}).to_string();
                producer
                    .send(
                        rdkafka::producer::FutureRecord::to(&s.input)
                            .key(&key)
                            .payload(&value),
                        Duration::from_secs(15),
                    )
                    .await
                    .unwrap_or_else(|(e, _)| panic!("produce in {in_codec}: {e}"));
            }
            let mut env = s.env(server);
            env.push(("KAFKA_COMPRESSION_TYPE", out_codec.to_string()));
            let mut bridge = Bridge::start(&env);
            stop_once_all_arrived(&mut bridge, &s.output, 1..=4, out_codec).await;
            let mut inputs = codecs.map(str::to_string).to_vec();
            inputs.sort();
            assert_eq!(codecs_on_disk(&s.input), inputs, "the inputs' codecs");
            // Beside the outputs' batches: transaction markers and small watermark
            // records, which librdkafka sends as they are (they do not shrink).
            let on_disk = codecs_on_disk(&s.output);
            assert!(
                on_disk.contains(&out_codec.to_string())
                    && on_disk.iter().all(|c| c == out_codec || c == "none"),
                "{out_codec}: the outputs' codecs: {on_disk:?}"
            );
        }
    });
    futures::future::join_all(runs).await;
}

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
    let deadline = Instant::now() + Duration::from_secs(90);
    while outputs_to_end(&s.output).await.len() < 6 {
        assert!(
            Instant::now() < deadline,
            "not 6 outputs within 90 s: {}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, _) = bridge.terminate();
    let log = bridge.log();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("WATCHBRIDGE_GUARANTEE guarantee=exactly_once"),
        "auto chose exactly_once: {log}"
    );
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(&output_key_counts(&outputs), user_output_keys(1..=3), &log);
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
/// names of `s`: exactly these, nothing prefixed but the transactional ids.
fn least_privilege(s: &Setup, exactly_once: bool) -> Vec<String> {
    let state = format!("{}.state", s.group);
    let watermarks = format!("{}.watermarks", s.output);
    let mut acls: Vec<String> = [
        (s.input.as_str(), "read"),
        (s.input.as_str(), "describe"),
        (s.output.as_str(), "write"),
        (s.output.as_str(), "describe"),
        (s.output.as_str(), "read"),
        (s.dlq.as_str(), "write"),
        (s.dlq.as_str(), "describe"),
        (state.as_str(), "read"),
        (state.as_str(), "write"),
        (state.as_str(), "describe"),
        (watermarks.as_str(), "read"),
        (watermarks.as_str(), "write"),
        (watermarks.as_str(), "describe"),
    ]
    .iter()
    .map(|(topic, operation)| format!("topic {topic} literal {operation}"))
    .collect();
    acls.push(format!("group {} literal read", s.group));
    if exactly_once {
        for operation in ["write", "describe"] {
            acls.push(format!(
                "transactional_id watchbridge-{}- prefixed {operation}",
                s.group
            ));
        }
    }
    acls
}

/// Topics made by the test (the bridge is not granted CREATE), ACLs granted but `left_out`,
/// one input produced: the bridge's settings for `mode`, and its operations port.
async fn least_privilege_run(
    name: &str,
    mode: &str,
    left_out: Option<&str>,
    server: &TestServer,
) -> (Setup, Vec<(&'static str, String)>, u16) {
    let c = secured();
    let s = Setup::new(name, 1).await;
    for topic in [
        s.output.clone(),
        s.dlq.clone(),
        format!("{}.watermarks", s.output),
        format!("{}.state", s.group),
    ] {
        c.broker.create_topic(&topic, 1).await;
    }
    let acls: Vec<String> = least_privilege(&s, mode == "exactly_once")
        .into_iter()
        .filter(|a| Some(a.as_str()) != left_out)
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
        let deadline = Instant::now() + Duration::from_secs(90);
        while outputs_to_end(&s.output).await.len() < 4 {
            assert!(Instant::now() < deadline, "{mode}: {}", bridge.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (code, _) = bridge.terminate();
        let log = bridge.log();
        assert_eq!(code, Some(0), "{mode}: {log}");
        assert!(
            log.contains(&format!("WATCHBRIDGE_GUARANTEE guarantee={mode}")),
            "{log}"
        );
        let outputs = outputs_to_end(&s.output).await;
        assert_each_once(&output_key_counts(&outputs), user_output_keys(1..=2), &log);
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

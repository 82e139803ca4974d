//! The `watchbridge` binary as a user runs it.

mod support;

use std::process::Command;
use support::http_server::{Reply, TestServer};

fn watchbridge(args: &[&str]) -> (i32, String, String) {
    watchbridge_with_env(args, &[])
}

/// Run the binary with only the given `WATCHBRIDGE_*` variables set.
fn watchbridge_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
            command.env_remove(name);
        }
    }
    let out = command
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run watchbridge");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_termination_prints_the_normal_form() {
    let (code, out, _) = watchbridge(&["check-termination", "any( total(5m),stable(90s) )"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "any(total(5m), stable(1m 30s))");
}

#[test]
fn check_termination_points_at_the_bad_token() {
    let (code, _, err) = watchbridge(&["check-termination", "any(total(5m), stabel(1m))"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown condition `stabel`"), "{err}");
    assert!(err.contains("                 ^^^^^^"), "{err}");
}

/// The whole bridge on the embedded broker, with short settings (about 12 s): every user is
/// accounted for with the ending its feed is built for, both bad inputs are dead-lettered,
/// and what was read back from Kafka passes the demo's checks.
#[test]
fn demo_runs_the_bridge_end_to_end_and_checks_what_reached_kafka() {
    let (code, out, err) = watchbridge(&[
        "demo",
        "--users",
        "6",
        "--poll-interval",
        "200ms",
        "--termination",
        "any(total(6s), stable(1500ms))",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    // Not a terminal: plain status lines, no redrawing.
    assert!(!out.contains('\x1b'), "{out}");
    assert!(out.contains("] inputs 8 read, 2 dead-lettered"), "{out}");
    let summary = out.split("── summary").nth(1).expect("a summary");
    let ended = |user: &str| -> (u64, u64, String) {
        let line = summary
            .lines()
            .find(|l| l.starts_with(&format!("{user} ")))
            .unwrap_or_else(|| panic!("{user} is not in the summary:\n{summary}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        (
            cols[1].parse().unwrap(),
            cols[2].parse().unwrap(),
            cols[3].to_string(),
        )
    };
    for (user, expected) in [
        ("user-00", "total"),
        ("user-01", "final"),
        ("user-02", "stable"),
        ("user-03", "failed"),
        ("user-04", ""),
        ("user-05", ""),
    ] {
        let (outputs, served, how) = ended(user);
        assert_eq!(outputs, served, "{user}:\n{summary}");
        if expected.is_empty() {
            assert!(
                ["final", "stable", "total"].contains(&how.as_str()),
                "{user}:\n{summary}"
            );
        } else {
            assert_eq!(how, expected, "{user}:\n{summary}");
        }
    }
    assert!(
        ended("user-00").0 > 0 && ended("user-03").0 == 0,
        "{summary}"
    );
    assert!(summary.contains("× 503, retried"), "{summary}");
    assert!(
        summary.contains(
            "totals: 8 inputs read: 6 watched, 2 dead-lettered (not_json 1, unresolvable 1)"
        ),
        "{summary}"
    );
    assert!(summary.contains("6 watches ended: "), "{summary}");
    assert!(
        summary.contains("bad-1 (not_json") && summary.contains("bad-2 (unresolvable"),
        "{summary}"
    );
    let produced: Vec<u64> = summary
        .lines()
        .find(|l| l.contains(" outputs produced, "))
        .expect("an outputs total")
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches([',', ';']).parse().ok())
        .collect();
    assert!(produced[0] > 0 && produced[0] == produced[1], "{summary}");
    let check = summary
        .lines()
        .find(|l| l.starts_with("check: "))
        .expect("a check line");
    assert!(check.starts_with("check: OK"), "{summary}");
    // The watermarks moved, and reached the output topic in-band.
    assert!(
        summary.contains("event time: merged ") && !summary.contains("merged none yet"),
        "{summary}"
    );
    assert!(
        !summary.contains(" 0 in-band watermark records"),
        "{summary}"
    );
    assert!(
        check.contains("no output key was produced twice"),
        "{check}"
    );
    assert!(
        check.contains("every output's Kafka timestamp equals its item's `at`"),
        "{check}"
    );
}

/// `WATCHBRIDGE_OUTPUT_FORMAT=avro`: the demo starts its embedded schema registry, the
/// bridge writes the envelope there, and the view decodes every output back to the item it
/// checks as in JSON mode.
#[test]
fn demo_with_avro_outputs_uses_an_embedded_registry_and_decodes_what_it_reads() {
    let (code, out, err) = watchbridge_with_env(
        &[
            "demo",
            "--users",
            "4",
            "--poll-interval",
            "200ms",
            "--termination",
            "any(total(5s), stable(1500ms))",
        ],
        &[("WATCHBRIDGE_OUTPUT_FORMAT", "avro")],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("  outputs Avro (the envelope), subject demo.events-value, embedded schema registry http://127.0.0.1:"),
        "{out}"
    );
    let summary = out.split("── summary").nth(1).expect("a summary");
    assert!(
        summary.contains("outputs: Avro (the envelope), subject demo.events-value, embedded schema registry http://127.0.0.1:")
            && summary.contains("; schema id 1\n"),
        "{summary}"
    );
    let check = summary
        .lines()
        .find(|l| l.starts_with("check: "))
        .expect("a check line");
    assert!(check.starts_with("check: OK"), "{summary}");
    // Some outputs read back ("30 outputs read back" contains "0 outputs read back").
    let read_back: usize = check
        .split(" outputs read back")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of outputs read back: {check}"));
    assert!(read_back > 0, "{summary}");
    assert!(!check.contains("do not decode"), "{summary}");
    assert!(
        check.contains("every output's Kafka timestamp equals its item's `at`")
            && check.contains("key and headers name each output's user and item"),
        "{check}"
    );
}

/// A registry the user names is used as is: one that does not answer stops the demo (the
/// output schema cannot be registered) within its start timeout, naming the variable.
#[test]
fn demo_with_avro_outputs_and_no_registry_answering_fails_naming_the_variable() {
    let began = std::time::Instant::now();
    let (code, out, err) = watchbridge_with_env(
        &["demo", "--users", "2"],
        &[
            ("WATCHBRIDGE_OUTPUT_FORMAT", "avro"),
            ("WATCHBRIDGE_SCHEMA_REGISTRY_URL", "http://127.0.0.1:9"),
        ],
    );
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("WATCHBRIDGE_SCHEMA_REGISTRY_URL"),
        "{out}\n{err}"
    );
    assert!(
        out.contains("the schema registry http://127.0.0.1:9"),
        "{out}"
    );
    assert!(
        began.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn demo_rejects_bad_settings_naming_the_variable() {
    let (code, _, err) = watchbridge(&["demo", "--termination", "polls(0)"]);
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_TERMINATION"), "{err}");
    for interval in ["0s", "soon"] {
        let (code, _, err) =
            watchbridge_with_env(&["demo"], &[("WATCHBRIDGE_POLL_INTERVAL", interval)]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("WATCHBRIDGE_POLL_INTERVAL"), "{err}");
    }
}

#[test]
fn poll_once_lists_a_tenants_files_and_refuses_a_path_escape() {
    let tmp = tempfile::tempdir().unwrap();
    for tenant in ["acme", "other"] {
        std::fs::create_dir(tmp.path().join(tenant)).unwrap();
        std::fs::write(tmp.path().join(tenant).join("a.csv"), "x").unwrap();
    }
    let pattern = format!("{}/{{/tenant}}/*.csv", tmp.path().display());
    let env = [
        ("WATCHBRIDGE_POLLER", "glob"),
        ("WATCHBRIDGE_GLOB", pattern.as_str()),
    ];
    let (code, out, err) =
        watchbridge_with_env(&["poll-once", "--input", r#"{"tenant":"acme"}"#], &env);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    let path = tmp.path().join("acme/a.csv").display().to_string();
    assert_eq!(lines[0]["key"], path.as_str());
    assert_eq!(lines[0]["value"]["size"], 1);
    assert!(
        err.contains("1 outputs, watermark none, complete false"),
        "{err}"
    );

    let (code, out, err) =
        watchbridge_with_env(&["poll-once", "--input", r#"{"tenant":"../other"}"#], &env);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("input refused") && err.contains("`{/tenant}`"),
        "{err}"
    );
}

#[test]
fn poll_once_names_a_missing_or_bad_setting() {
    let (code, _, err) = watchbridge_with_env(
        &["poll-once", "--input", "{}"],
        &[("WATCHBRIDGE_POLLER", "glob")],
    );
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_GLOB: is required"), "{err}");
    let (code, _, err) = watchbridge_with_env(
        &["poll-once", "--input", "{}"],
        &[
            ("WATCHBRIDGE_HTTP_URL", "http://h/"),
            ("WATCHBRIDGE_HTTP_ITEMS", "data"),
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_HTTP_ITEMS"), "{err}");
    let (code, _, err) = watchbridge_with_env(&["poll-once", "--input", "{oops"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("--input is not JSON"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn poll_once_reads_an_http_api_with_a_secret_header_it_never_prints() {
    let server = TestServer::start(|seen| {
        if seen
            .headers
            .get("authorization")
            .is_some_and(|v| v == "Bearer hunter2")
        {
            Reply::json(
                serde_json::json!({"data": [{"id": "ev-1", "at": "2026-11-30T09:00:00+01:00"}]}),
            )
        } else {
            Reply::status(401, "bad token")
        }
    })
    .await;
    let url = server.url("/users/{/id}/events");
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        watchbridge_with_env(
            &["poll-once", "--input", r#"{"id": 42}"#, "--key", "user-42"],
            &[
                ("WATCHBRIDGE_HTTP_URL", url.as_str()),
                ("WATCHBRIDGE_HTTP_ITEMS", "/data"),
                ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id"),
                ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at"),
                (
                    "WATCHBRIDGE_HTTP_HEADERS",
                    "Authorization: Bearer ${WB_TEST_TOKEN}",
                ),
                ("WB_TEST_TOKEN", "hunter2"),
                ("WATCHBRIDGE_LOG", "trace"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["key"], "ev-1");
    assert_eq!(line["event_time"], "2026-11-30T08:00:00Z");
    assert_eq!(server.requests()[0].target, "/users/42/events");
    assert!(
        !err.contains("hunter2") && !out.contains("hunter2"),
        "{err}"
    );
}

/// A bounded run cannot go through the repartition topic (yet): refused at start, naming the
/// setting and the way out, not run with two watches per watch key.
#[test]
fn a_bounded_run_with_a_watch_key_is_refused_naming_the_repartition_setting() {
    let env = [
        ("WATCHBRIDGE_BROKERS", "embedded"),
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
        ("WATCHBRIDGE_WATCH_KEY", "/id"),
        ("WATCHBRIDGE_MODE", "bounded"),
    ];
    let (code, err) = watchbridge_within(std::time::Duration::from_secs(20), &["run"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("WATCHBRIDGE_REPARTITION") && err.contains("never"),
        "{err}"
    );
}

#[test]
fn run_names_a_missing_or_bad_setting() {
    let (code, _, err) = watchbridge_with_env(&[], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_INPUT_TOPIC"), "{err}");
    let topics = [
        ("WATCHBRIDGE_BROKERS", "embedded"),
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
    ];
    for (var, value) in [
        ("WATCHBRIDGE_TERMINATION", "stabel(1m)"),
        ("WATCHBRIDGE_POLL_INTERVAL", "soon"),
        ("WATCHBRIDGE_WATCH_KEY", "id"),
        ("WATCHBRIDGE_REPARTITION", "sometimes"),
        ("WATCHBRIDGE_HTTP_ITEMS", "data"),
        ("WATCHBRIDGE_POLLER", "ftp"),
        ("KAFKA_NO_SUCH_PROPERTY", "1"),
        ("WATCHBRIDGE_METRICS_ADDR", "9898"),
        ("WATCHBRIDGE_METRICS_ADDR", "localhost:9898"),
        ("WATCHBRIDGE_LOG_FORMAT", "xml"),
        ("WATCHBRIDGE_GUARANTEE", "twice"),
        ("WATCHBRIDGE_BACKOFF", "2x"),
        ("WATCHBRIDGE_HTTP_METHOD", "PUT"),
        ("WATCHBRIDGE_HTTP_BODY", r#"{"id": "{/id}"}"#),
        ("WATCHBRIDGE_BACKOFF", "2x,1s"),
        ("WATCHBRIDGE_START_TIMEOUT", "0s"),
        ("WATCHBRIDGE_START_TIMEOUT", "soon"),
    ] {
        let mut env = topics.to_vec();
        env.push((var, value));
        // Bounded: a setting that stopped being checked would start a bridge that runs on.
        let (code, err) = watchbridge_within(std::time::Duration::from_secs(20), &["run"], &env);
        assert_eq!(code, 2, "{var}: {err}");
        assert!(err.contains(var), "{var}: {err}");
    }
    let (code, out, _) = watchbridge_with_env(&["run", "--help"], &[]);
    assert_eq!(code, 0);
    for var in [
        "WATCHBRIDGE_BROKERS",
        "WATCHBRIDGE_GROUP_ID",
        "WATCHBRIDGE_DLQ_TOPIC",
        "WATCHBRIDGE_WATCH_KEY",
        "WATCHBRIDGE_HTTP_URL",
        "WATCHBRIDGE_GLOB",
        "WATCHBRIDGE_SHARDED_PATTERN",
        "WATCHBRIDGE_METRICS_ADDR",
        "WATCHBRIDGE_LOG_FORMAT",
        "WATCHBRIDGE_BACKOFF",
        "WATCHBRIDGE_HTTP_METHOD",
        "WATCHBRIDGE_HTTP_BODY",
    ] {
        assert!(out.contains(var), "--help lists {var}");
    }
    assert!(out.contains("[default: watchbridge]"), "and defaults");
}

/// A process that is stopped (SIGTERM, then killed) when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigterm(child: &mut std::process::Child) -> Option<i32> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

/// The bridge on the embedded broker with `extra` settings, its stderr going to a file;
/// returns it and its log once the log says `until` (or after 60 s).
fn embedded_bridge(extra: &[(&str, &str)], until: &str) -> (Running, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
            command.env_remove(name);
        }
    }
    let child = command
        .envs([
            ("WATCHBRIDGE_BROKERS", "embedded"),
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
            ("WATCHBRIDGE_METRICS_ADDR", "127.0.0.1:0"),
        ])
        .envs(extra.iter().copied())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let running = Running(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains(until) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    (running, text)
}

/// The embedded broker only when asked for: `WATCHBRIDGE_BROKERS` unset fails the start,
/// naming the variable and both ways to set it (a deployment that lost the variable must not
/// run on a broker that forgets everything).
#[test]
fn run_without_brokers_is_refused_unless_embedded_is_said() {
    let env = [
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
        ("WATCHBRIDGE_METRICS_ADDR", "off"),
    ];
    for brokers in [None, Some(""), Some(" ")] {
        let mut env = env.to_vec();
        env.extend(brokers.map(|b| ("WATCHBRIDGE_BROKERS", b)));
        let (code, err) = watchbridge_within(std::time::Duration::from_secs(20), &["run"], &env);
        assert_eq!(code, 2, "{brokers:?}: {err}");
        assert!(
            err.contains("error: WATCHBRIDGE_BROKERS: is required")
                && err.contains("host:port")
                && err.contains("`embedded`"),
            "{brokers:?}: {err}"
        );
    }
}

/// `GET path` of the operations server at `addr`: status and body, or `None` when nothing
/// answers.
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The operations server's address, from the log line that says where it serves.
fn ops_address(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("serving /metrics"))
        .and_then(|l| l.split("address=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no ops server address in the log: {log}"))
        .to_string()
}

#[test]
fn with_brokers_embedded_the_bridge_runs_on_an_embedded_broker_and_says_so() {
    let (mut running, text) = embedded_bridge(&[], "WATCHBRIDGE_GUARANTEE");
    assert!(
        text.contains("WATCHBRIDGE_BROKERS=embedded: using an EMBEDDED in-memory broker"),
        "{text}"
    );
    assert!(text.contains("bridge starting"), "{text}");
    // librdkafka's mock cluster hands aborted records to read_committed readers.
    assert!(
        text.contains("WATCHBRIDGE_GUARANTEE guarantee=recovery"),
        "{text}"
    );
    assert!(
        text.contains("serving /metrics, /healthz, /readyz and /version"),
        "{text}"
    );
    // Ready, and /readyz says on what: a probe or a person cannot take it for a cluster.
    let addr = ops_address(&text);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let ready = loop {
        match http_get(&addr, "/readyz") {
            Some((200, body)) => break body,
            other if std::time::Instant::now() > deadline => panic!("never ready: {other:?}"),
            _ => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    assert_eq!(
        ready,
        "ready\nbroker: embedded (WATCHBRIDGE_BROKERS=embedded): in memory, it keeps nothing\n"
    );
    assert_eq!(sigterm(&mut running.0), Some(0));
}

/// `KAFKA_*` properties go only to the clients they are for (a consumer property is not
/// given to the producer, nor a producer one to the consumers), and `KAFKA_CONSUMER_*` /
/// `KAFKA_PRODUCER_*` target one kind: a correct configuration starts without librdkafka
/// warning about properties it ignores.
#[test]
fn kafka_properties_reach_only_the_clients_they_are_for() {
    let (mut running, text) = embedded_bridge(
        &[
            ("KAFKA_SESSION_TIMEOUT_MS", "7000"),
            ("KAFKA_FETCH_WAIT_MAX_MS", "100"),
            ("KAFKA_LINGER_MS", "5"),
            ("KAFKA_ENABLE_IDEMPOTENCE", "true"),
            ("KAFKA_CONSUMER_QUEUED_MIN_MESSAGES", "1000"),
            ("KAFKA_PRODUCER_BATCH_NUM_MESSAGES", "5000"),
        ],
        "partition state restored",
    );
    // Every client of the start has been created by the first restored partition.
    assert!(text.contains("partition state restored"), "{text}");
    assert_eq!(sigterm(&mut running.0), Some(0));
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("CONFWARN") || l.contains("will be ignored"))
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
    for property in [
        "queued.min.messages",
        "batch.num.messages",
        "session.timeout.ms",
    ] {
        assert!(
            text.contains(&format!("property={property}")),
            "{property} logged as taken: {text}"
        );
    }
}

/// Kubernetes gives every pod of a namespace with a Service named `kafka` the service-link
/// variables `KAFKA_PORT`, `KAFKA_PORT_9092_TCP…` and `KAFKA_SERVICE_HOST/PORT`: they are
/// not librdkafka properties, and the start goes on without them, saying so once.
#[test]
fn kubernetes_service_link_variables_do_not_stop_the_start() {
    let (mut running, text) = embedded_bridge(
        &[
            ("KAFKA_PORT", "tcp://10.0.0.1:9092"),
            ("KAFKA_PORT_9092_TCP", "tcp://10.0.0.1:9092"),
            ("KAFKA_PORT_9092_TCP_ADDR", "10.0.0.1"),
            ("KAFKA_PORT_9092_TCP_PORT", "9092"),
            ("KAFKA_PORT_9092_TCP_PROTO", "tcp"),
            ("KAFKA_SERVICE_HOST", "10.0.0.1"),
            ("KAFKA_SERVICE_PORT", "9092"),
            ("KAFKA_SERVICE_PORT_BROKER", "9092"),
        ],
        "partition state restored",
    );
    assert!(text.contains("partition state restored"), "{text}");
    assert_eq!(sigterm(&mut running.0), Some(0));
    let said: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("service-link"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {text}");
    assert!(
        said[0].contains("KAFKA_PORT") && said[0].contains("KAFKA_SERVICE_HOST"),
        "{said:?}"
    );
}

/// `run` with its required settings (on the embedded broker, unless `extra` names brokers)
/// and `extra`, refused at start (exit 2, within 20 s): its stderr.
fn run_refused(extra: &[(&str, &str)]) -> String {
    let mut env = vec![
        ("WATCHBRIDGE_BROKERS", "embedded"),
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
    ];
    env.extend_from_slice(extra);
    let (code, err) = watchbridge_within(std::time::Duration::from_secs(20), &["run"], &env);
    assert_eq!(code, 2, "{extra:?}: {err}");
    err
}

/// The brokers have one setting: `KAFKA_BOOTSTRAP_SERVERS` beside `WATCHBRIDGE_BROKERS`
/// would silently win over it in some clients and not others.
#[test]
fn kafka_bootstrap_servers_is_refused_naming_watchbridge_brokers() {
    for extra in [
        &[("KAFKA_BOOTSTRAP_SERVERS", "a:9092")][..],
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", "a:9092"),
            ("WATCHBRIDGE_BROKERS", "b:9092"),
        ][..],
    ] {
        let err = run_refused(extra);
        assert!(
            err.contains("KAFKA_BOOTSTRAP_SERVERS") && err.contains("WATCHBRIDGE_BROKERS"),
            "{err}"
        );
    }
}

/// A secret can come from a file (`KAFKA_SASL_PASSWORD_FILE`, as Kubernetes and Docker
/// mount them); a file that cannot be read, or both forms at once, is named at start.
#[test]
fn a_kafka_secret_from_a_file_that_cannot_be_read_is_named_at_start() {
    let err = run_refused(&[("KAFKA_SASL_PASSWORD_FILE", "/nonexistent/password")]);
    assert!(
        err.contains("KAFKA_SASL_PASSWORD_FILE") && err.contains("/nonexistent/password"),
        "{err}"
    );
    let err = run_refused(&[
        ("KAFKA_SASL_PASSWORD_FILE", "/etc/hostname"),
        ("KAFKA_SASL_PASSWORD", "inline-secret"),
    ]);
    assert!(
        err.contains("KAFKA_SASL_PASSWORD") && err.contains("both"),
        "{err}"
    );
    assert!(!err.contains("inline-secret"), "{err}");
    // The bridge's own secrets too (`WATCHBRIDGE_ADMIN_TOKEN_FILE`, …).
    let err = run_refused(&[("WATCHBRIDGE_ADMIN_TOKEN_FILE", "/nonexistent/admin-token")]);
    assert!(
        err.contains("WATCHBRIDGE_ADMIN_TOKEN_FILE") && err.contains("/nonexistent/admin-token"),
        "{err}"
    );
}

/// A port already taken is a start error naming the variable, before anything else runs.
#[test]
fn a_metrics_address_in_use_fails_the_start_naming_the_variable() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, _, err) = watchbridge_with_env(
        &["run"],
        &[
            ("WATCHBRIDGE_BROKERS", "embedded"),
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
            ("WATCHBRIDGE_METRICS_ADDR", &addr),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "WATCHBRIDGE_METRICS_ADDR: cannot listen on {addr}"
        )),
        "{err}"
    );
}

#[test]
fn broker_prints_an_address_that_clients_can_use() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchbridge"))
        .args(["broker", "--topic", "t:2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut address,
    )
    .unwrap();
    let _running = Running(child);
    let address = address.trim();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let (code, _, err) = watchbridge(&[
        "produce",
        "--brokers",
        address,
        "--topic",
        "t",
        "--key",
        "k",
        "hello",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = watchbridge(&["consume", "--brokers", address, "--topic", "t", "-e"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(" k ") && out.trim_end().ends_with("hello"),
        "{out}"
    );
}

/// Run the binary, killing it if it has not ended within `limit` (code -1 then).
fn watchbridge_within(
    limit: std::time::Duration,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") {
            command.env_remove(name);
        }
    }
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut child = Running(
        command
            .args(args)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .expect("run watchbridge"),
    );
    let deadline = std::time::Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if std::time::Instant::now() > deadline {
            break -1;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(child);
    (code, std::fs::read_to_string(stderr.path()).unwrap())
}

/// A placeholder in the URL's host or port lets the input choose the host (`0x7f000002` is
/// 127.0.0.2): without WATCHBRIDGE_HTTP_ALLOWED_HOSTS the start is refused, naming the
/// setting and the placeholder; with it, only the allowed hosts, in their normal form.
#[tokio::test(flavor = "multi_thread")]
async fn a_template_whose_input_picks_the_host_is_refused_at_start() {
    let server = TestServer::start(|_| Reply::json(serde_json::json!([{"id": "x"}]))).await;
    let port = server.addr.port().to_string();
    let url = format!("http://{{key}}:{port}/feed");
    let outcome = tokio::task::spawn_blocking(move || {
        let limit = std::time::Duration::from_secs(30);
        let template = [("WATCHBRIDGE_HTTP_URL", url.as_str())];
        let poll_once = ["poll-once", "--input", "{}", "--key", "0x7f000002"];
        let refused_once = watchbridge_within(limit, &poll_once, &template);
        let mut run_env = template.to_vec();
        run_env.extend([
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_METRICS_ADDR", "off"),
            ("WATCHBRIDGE_BROKERS", "embedded"),
        ]);
        let refused_run = watchbridge_within(limit, &["run"], &run_env);
        let by_name = format!("localhost:{port}");
        let mut allowed_env = template.to_vec();
        allowed_env.push(("WATCHBRIDGE_HTTP_ALLOWED_HOSTS", by_name.as_str()));
        let not_allowed = watchbridge_within(limit, &poll_once, &allowed_env);
        let by_ip = format!("127.0.0.1:{port}");
        allowed_env[1].1 = by_ip.as_str();
        let numeric = ["poll-once", "--input", "{}", "--key", "2130706433"];
        let allowed = watchbridge_within(limit, &numeric, &allowed_env);
        (refused_once, refused_run, not_allowed, allowed)
    })
    .await
    .unwrap();
    let (refused_once, refused_run, not_allowed, allowed) = outcome;
    for (what, (code, err)) in [("poll-once", refused_once), ("run", refused_run)] {
        assert_eq!(code, 2, "{what}: {err}");
        assert!(
            err.contains("WATCHBRIDGE_HTTP_URL")
                && err.contains("`{key}`")
                && err.contains("WATCHBRIDGE_HTTP_ALLOWED_HOSTS"),
            "{what}: {err}"
        );
    }
    assert_eq!(not_allowed.0, 1, "{}", not_allowed.1);
    assert!(
        not_allowed.1.contains("input refused")
            && not_allowed
                .1
                .contains("not in WATCHBRIDGE_HTTP_ALLOWED_HOSTS"),
        "{}",
        not_allowed.1
    );
    assert_eq!(allowed.0, 0, "{}", allowed.1);
    assert_eq!(server.requests().len(), 1, "2130706433 is 127.0.0.1");
}

/// Issue 17, item 8: a mistyped `WATCHBRIDGE_HTTP_HEADERS` line does not echo its value.
#[test]
fn a_mistyped_header_line_does_not_echo_its_secret() {
    for headers in [
        "Authorization Bearer sk-live-c0ffee: x",
        "X-Api-Key sk-live-c0ffee",
        "Authorization: Bearer sk-live-c0ffee\u{1}",
    ] {
        let (code, _, err) = watchbridge_with_env(
            &["poll-once", "--input", "{}"],
            &[
                ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:9/x"),
                ("WATCHBRIDGE_HTTP_HEADERS", headers),
            ],
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("WATCHBRIDGE_HTTP_HEADERS"), "{err}");
        assert!(!err.contains("c0ffee"), "{headers:?}: {err}");
    }
}

/// Issue 20: `WATCHBRIDGE_HTTP_METHOD=POST` (any case) and `WATCHBRIDGE_HTTP_BODY` from
/// the environment reach the poller: the server sees a POST with the body made from the
/// input; `--help` does not show the body (it may hold a secret); a body that cannot be
/// JSON fails the start naming the variable, without quoting it.
#[tokio::test(flavor = "multi_thread")]
async fn poll_once_posts_the_json_body_from_the_environment() {
    let server = TestServer::start(|seen| {
        let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_default();
        if seen.method == "POST" && body["variables"]["id"] == 42 {
            Reply::json(serde_json::json!({"data": [{"id": "ev-1"}]}))
        } else {
            Reply::status(400, "not the expected POST")
        }
    })
    .await;
    let url = server.url("/graphql");
    let body = r#"{"query": "{/q} s3cret-query", "variables": {"id": {/id}}}"#;
    let env = move |body: &'static str| {
        vec![
            ("WATCHBRIDGE_HTTP_URL", url.clone()),
            ("WATCHBRIDGE_HTTP_ITEMS", "/data".to_string()),
            ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".to_string()),
            ("WATCHBRIDGE_HTTP_METHOD", "post".to_string()),
            ("WATCHBRIDGE_HTTP_BODY", body.to_string()),
        ]
    };
    let run = |args: &'static [&'static str], env: Vec<(&'static str, String)>| {
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            watchbridge_with_env(args, &env)
        })
    };
    let (code, out, err) = run(
        &["poll-once", "--input", r#"{"id": 42, "q": "events"}"#],
        env(body),
    )
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("ev-1"), "{out}");
    let seen = server.requests();
    assert_eq!(seen[0].headers["content-type"], "application/json");
    let (code, out, _) = run(&["run", "--help"], env(body)).await.unwrap();
    assert_eq!(code, 0);
    assert!(out.contains("WATCHBRIDGE_HTTP_BODY"), "{out}");
    assert!(!out.contains("s3cret-query"), "{out}");
    let (code, _, err) = run(
        &["poll-once", "--input", "{}"],
        env(r#"{"query": "s3cret-query", "id": x{/id}}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("WATCHBRIDGE_HTTP_BODY"), "{err}");
    assert!(!err.contains("s3cret-query"), "{err}");
}

/// Issue 17, item 8: user info and secret query parameters in WATCHBRIDGE_HTTP_URL never
/// show: not in `--help` (which lists variables set in the environment), not in a start-up
/// error, not in a poll error from `poll-once`.
#[test]
fn url_secrets_show_neither_in_help_nor_in_errors() {
    let url = "http://ada:pw-hunter2@127.0.0.1:9/x?api_key=qs-s3cret&tenant=acme";
    let env = [("WATCHBRIDGE_HTTP_URL", url)];
    for args in [&["run", "--help"][..], &["poll-once", "--help"]] {
        let (code, out, err) = watchbridge_with_env(args, &env);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("WATCHBRIDGE_HTTP_URL"), "{out}");
        assert!(
            !out.contains("hunter2") && !out.contains("qs-s3cret"),
            "{args:?}: {out}"
        );
    }
    let (code, _, err) = watchbridge_with_env(&["poll-once", "--input", "{}"], &env);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("127.0.0.1:9"), "{err}");
    assert!(
        !err.contains("hunter2") && !err.contains("qs-s3cret"),
        "{err}"
    );
    // A template refused at start.
    let bad = "http://ada:pw-hunter2@{key}:8080/x";
    let (code, _, err) = watchbridge_with_env(
        &["poll-once", "--input", "{}"],
        &[("WATCHBRIDGE_HTTP_URL", bad)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("WATCHBRIDGE_HTTP_URL"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// A URL template that cannot become a URL whatever the input (no host, a space in the
/// host, a port that is not a number) is refused at start, naming the setting, rather than
/// dead-lettering every input.
#[test]
fn a_url_template_that_cannot_become_a_url_is_refused_at_start() {
    let limit = std::time::Duration::from_secs(20);
    for template in [
        "http://",
        "https:///users/{/id}",
        "http://?q={/id}",
        "http://my host/users/{/id}",
        "http://host:notaport/users/{/id}",
        "http://host:99999/{/id}",
    ] {
        let env = [
            ("WATCHBRIDGE_HTTP_URL", template),
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_METRICS_ADDR", "off"),
            ("WATCHBRIDGE_BROKERS", "embedded"),
        ];
        let (code, err) = watchbridge_within(limit, &["run"], &env);
        assert_eq!(code, 2, "run {template:?}: {err}");
        assert!(
            err.contains("WATCHBRIDGE_HTTP_URL") && err.contains("not a valid URL"),
            "run {template:?}: {err}"
        );
        let (code, _, err) =
            watchbridge_with_env(&["poll-once", "--input", r#"{"id": 1}"#], &env[..1]);
        assert_eq!(code, 2, "poll-once {template:?}: {err}");
        assert!(err.contains("WATCHBRIDGE_HTTP_URL"), "{template:?}: {err}");
    }
}

/// A misspelt variable would be ignored and its default used: every `WATCHBRIDGE_*` variable
/// that is not a setting fails the start (of `run` and of `config --check`), naming it and
/// the setting meant. `WATCHBRIDGE_TEST_*`, which the test suite sets for itself, is not one.
#[test]
fn a_misspelt_variable_fails_the_start_naming_the_setting_meant() {
    let err = run_refused(&[("WATCHBRIDGE_BROKER", "kafka:9092")]);
    assert!(
        err.contains(
            "error: WATCHBRIDGE_BROKER: is not a setting; did you mean WATCHBRIDGE_BROKERS?"
        ),
        "{err}"
    );
    let err = run_refused(&[("WATCHBRIDGE_POLL_INTERVALL", "5s")]);
    assert!(
        err.contains("did you mean WATCHBRIDGE_POLL_INTERVAL?"),
        "{err}"
    );
    let (code, out, err) = watchbridge_with_env(
        &["config", "--check"],
        &[
            ("WATCHBRIDGE_BROKERS", "kafka:9092"),
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
            ("WATCHBRIDGE_TEST_ANYTHING", "1"),
            ("WATCHBRIDGE_CACHE", "/tmp"),
        ],
    );
    assert_eq!((code, out.as_str()), (0, "configuration OK\n"), "{err}");
}

/// The names the repository's harness, scripts, deployment files and examples set are
/// settings (or reserved): none of them would stop a bridge they start.
#[test]
fn every_variable_the_repository_sets_is_a_setting_or_reserved() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("Makefile")];
    for dir in ["tests", "tests/support", "deploy", "scripts", "examples"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            // These two name non-settings on purpose (misspellings, examples).
            let on_purpose = path.ends_with("tests/cli.rs") || path.ends_with("tests/ops_files.rs");
            if path.is_file() && !on_purpose {
                files.push(path);
            }
        }
    }
    let mut names = std::collections::BTreeMap::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text
        };
        for (at, _) in text.match_indices("WATCHBRIDGE_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // `WATCHBRIDGE_RETRY_*`, `WATCHBRIDGE_`: a family, not a name.
            if !name.ends_with('_') {
                names.insert(name, file.display().to_string());
            }
        }
    }
    assert!(names.len() > 20, "{names:?}");
    let env = names.keys().map(|n| (n.clone(), String::new()));
    let unknown: Vec<String> = watchbridge::config::known::unknown_variables(
        env,
        &watchbridge::config::known::known_names(),
    )
    .iter()
    .map(|e| format!("{e} (in {})", names[e.var.as_ref()]))
    .collect();
    assert!(unknown.is_empty(), "{unknown:#?}");
}

/// `watchbridge config`: every setting with its value and where it came from (a flag, the
/// environment, a `NAME_FILE` file, the default), secrets never shown.
#[test]
fn config_shows_where_each_value_came_from_and_never_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("registry-password");
    std::fs::write(&password, "registry-s3cret\n").unwrap();
    let password = password.display().to_string();
    let env = [
        ("WATCHBRIDGE_BROKERS", "kafka-1:9092,kafka-2:9092"),
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_POLL_INTERVAL", "1m"),
        (
            "WATCHBRIDGE_HTTP_URL",
            "https://api.example/users/{/id}?api_key=url-s3cret&page=1",
        ),
        ("WATCHBRIDGE_ADMIN_TOKEN", "admin-s3cret"),
        (
            "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD_FILE",
            password.as_str(),
        ),
        ("KAFKA_SASL_PASSWORD", "kafka-s3cret"),
        ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
    ];
    let (code, out, err) = watchbridge_with_env(&["config", "--poll-interval", "3s"], &env);
    assert_eq!(code, 0, "{err}");
    for line in [
        "WATCHBRIDGE_BROKERS=kafka-1:9092,kafka-2:9092  (env)",
        "WATCHBRIDGE_POLL_INTERVAL=3s  (flag)",
        "WATCHBRIDGE_GROUP_ID=watchbridge  (default)",
        "WATCHBRIDGE_DLQ_TOPIC  (unset)",
        "WATCHBRIDGE_HTTP_URL=https://api.example/users/{/id}?api_key=<redacted>&page=1  (env)",
        "WATCHBRIDGE_ADMIN_TOKEN=<redacted>  (env)",
        "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD=<redacted>  (file)",
        "WATCHBRIDGE_LOG=info  (default)",
        "KAFKA_SASL_PASSWORD=<redacted>  (env)",
        "KAFKA_SECURITY_PROTOCOL=SASL_SSL  (env)",
        "# Kafka and topics",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} in:\n{out}");
    }
    assert!(
        !out.contains("s3cret") && !err.contains("s3cret"),
        "{out}{err}"
    );
    let (code, out, err) = watchbridge_with_env(&["config", "--format", "json"], &env);
    assert_eq!(code, 0, "{err}");
    let settings: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let setting = |name: &str| {
        settings
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {out}"))
    };
    assert_eq!(setting("WATCHBRIDGE_ADMIN_TOKEN")["value"], "<redacted>");
    assert_eq!(setting("WATCHBRIDGE_POLL_INTERVAL")["value"], "1m");
    assert_eq!(setting("WATCHBRIDGE_POLL_INTERVAL")["source"], "env");
    assert_eq!(
        setting("WATCHBRIDGE_DLQ_TOPIC")["value"],
        serde_json::Value::Null
    );
    assert!(!out.contains("s3cret"), "{out}");
}

/// `watchbridge config --check`: what `run` checks before it starts, without contacting
/// anything (the brokers named here do not exist): `configuration OK`, or every error, each
/// naming its variable.
#[test]
fn config_check_passes_a_good_configuration_and_names_every_error_of_a_bad_one() {
    let good = [
        ("WATCHBRIDGE_BROKERS", "127.0.0.1:1"),
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
    ];
    let began = std::time::Instant::now();
    let (code, out, err) = watchbridge_with_env(&["config", "--check"], &good);
    assert_eq!((code, out.as_str()), (0, "configuration OK\n"), "{err}");
    assert!(
        began.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
    let mut bad = good.to_vec();
    bad.extend([
        ("WATCHBRIDGE_TERMINATION", "stabel(1m)"),
        ("WATCHBRIDGE_HTTP_ITEMS", "data"),
        ("WATCHBRIDGE_GROUPID", "mine"),
    ]);
    let (code, out, err) = watchbridge_with_env(&["config", "--check"], &bad);
    assert_eq!(code, 2, "{out}{err}");
    assert!(!out.contains("configuration OK"), "{out}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 3, "{err}");
    assert!(
        errors[0]
            .contains("WATCHBRIDGE_GROUPID: is not a setting; did you mean WATCHBRIDGE_GROUP_ID?"),
        "{err}"
    );
    assert!(
        errors[1].starts_with("error: WATCHBRIDGE_TERMINATION:"),
        "{err}"
    );
    assert!(
        errors[2].starts_with("error: WATCHBRIDGE_HTTP_ITEMS:"),
        "{err}"
    );
    // A flag too: the same flags as `run`.
    let (code, _, err) =
        watchbridge_with_env(&["config", "--check", "--poll-interval", "0s"], &good);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("WATCHBRIDGE_POLL_INTERVAL"), "{err}");
}

/// `run --help` lists its hundred-odd settings by topic: every flag but `--help` under a
/// heading of its own section (the sections of docs/configuration.md), none left under
/// the catch-all `Options:`.
#[test]
fn run_help_groups_every_setting_under_a_heading() {
    let (code, out, err) = watchbridge_with_env(&["run", "--help"], &[]);
    assert_eq!(code, 0, "{err}");
    let mut heading = "";
    let mut under: std::collections::BTreeMap<&str, usize> = Default::default();
    for line in out.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            heading = line;
        } else if let Some(flag) = line.trim_start().strip_prefix("--") {
            if !flag.starts_with("help") {
                assert_ne!(heading, "Options:", "--{flag} has no heading");
                *under.entry(heading).or_default() += 1;
            }
        }
    }
    for expected in [
        "Kafka and topics:",
        "Formats (docs/formats.md):",
        "Watches and polling:",
        "Termination:",
        "HTTP poller (WATCHBRIDGE_POLLER=http):",
        "File and object-store pollers (glob, sharded, object_store):",
        "Watermarks:",
        "Durable state:",
        "Operations:",
    ] {
        assert!(
            under.get(expected).is_some_and(|n| *n > 0),
            "{expected} in {under:?}"
        );
    }
    assert_eq!(under.len(), 9, "{under:?}");
}

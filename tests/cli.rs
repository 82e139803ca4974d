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
        if name.starts_with("WATCHBRIDGE_") {
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

#[test]
fn demo_runs_every_watch_to_an_end_and_dedups() {
    let (code, out, err) = watchbridge(&[
        "demo",
        "--inputs",
        "7",
        "--poll-interval",
        "50ms",
        "--termination",
        "any(total(2s), stable(400ms))",
        "--metrics",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("  start  ").count(), 7, "{out}");
    assert_eq!(out.matches("  end    ").count(), 7, "{out}");
    assert!(out.contains("(final)"), "{out}");
    assert!(out.contains("user-6 (failed)"), "{out}");
    // Every output line is new: no output key is printed twice.
    let mut keys: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("  new "))
        .filter_map(|l| l.split(" -> ").nth(1)?.split(' ').next())
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "an output was emitted twice:\n{out}");
    assert!(
        out.contains("watchbridge_duplicates_suppressed_total"),
        "{out}"
    );
}

#[test]
fn demo_rejects_a_bad_termination_naming_the_variable() {
    let (code, _, err) = watchbridge(&["demo", "--termination", "polls(0)"]);
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_TERMINATION"), "{err}");
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

#[test]
fn run_names_a_missing_or_bad_setting() {
    let (code, _, err) = watchbridge_with_env(&[], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("WATCHBRIDGE_INPUT_TOPIC"), "{err}");
    let topics = [
        ("WATCHBRIDGE_INPUT_TOPIC", "users"),
        ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
        ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
    ];
    for (var, value) in [
        ("WATCHBRIDGE_TERMINATION", "stabel(1m)"),
        ("WATCHBRIDGE_POLL_INTERVAL", "soon"),
        ("WATCHBRIDGE_WATCH_KEY", "id"),
        ("WATCHBRIDGE_HTTP_ITEMS", "data"),
        ("WATCHBRIDGE_POLLER", "ftp"),
        ("KAFKA_NO_SUCH_PROPERTY", "1"),
    ] {
        let mut env = topics.to_vec();
        env.push((var, value));
        let (code, _, err) = watchbridge_with_env(&["run"], &env);
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

#[test]
fn without_brokers_the_bridge_runs_on_an_embedded_broker_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") {
            command.env_remove(name);
        }
    }
    let child = command
        .envs([
            ("WATCHBRIDGE_INPUT_TOPIC", "users"),
            ("WATCHBRIDGE_OUTPUT_TOPIC", "events"),
            ("WATCHBRIDGE_HTTP_URL", "http://127.0.0.1:1/{/id}"),
        ])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("bridge starting") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(text.contains("EMBEDDED in-memory broker"), "{text}");
    assert!(text.contains("bridge starting"), "{text}");
    assert_eq!(sigterm(&mut running.0), Some(0));
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

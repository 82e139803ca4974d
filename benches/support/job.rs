//! A job under measurement: a subprocess (the `watchbridge` binary, or a peer written
//! another way), its log, and stopping it.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the job of a case named `id` writes its log.
pub fn log_path(id: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("watchbridge-bench-{id}.log"))
}

/// The last 30 lines of a job's log, for a failure message.
pub fn log_tail(log: &Path) -> String {
    let mut text = String::new();
    let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Waits up to `limit` for `child` to exit, then SIGKILLs it.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("poll the job") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// SIGTERM (the orderly stop every job here handles).
pub fn terminate(child: &Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

/// The peak resident set of process `pid` so far (`VmHWM` of `/proc/PID/status`), bytes;
/// 0 where it cannot be read.
pub fn peak_rss(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `watchbridge run` (the release binary) with the HTTP poller on the feeds of
/// [`super::feeds::FeedServer`] at `feeds`: group `{id}-group`, topics `{id}.in` and
/// `{id}.out`, polls every second, defaults otherwise; `log_var` names the variable with its
/// log filter (default `warn`).
pub fn watchbridge_command(bootstrap: &str, id: &str, feeds: &str, log_var: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    // watchbridge turns every `KAFKA_*` variable into a librdkafka property; the bench's
    // environment may hold others' (scripts/kafka.sh reads KAFKA_LIBS and KAFKA_HEAP).
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KAFKA_") {
            c.env_remove(name);
        }
    }
    c.arg("run")
        .env("WATCHBRIDGE_BROKERS", bootstrap)
        .env("WATCHBRIDGE_GROUP_ID", format!("{id}-group"))
        .env("WATCHBRIDGE_INPUT_TOPIC", format!("{id}.in"))
        .env("WATCHBRIDGE_OUTPUT_TOPIC", format!("{id}.out"))
        .env("WATCHBRIDGE_POLLER", "http")
        .env("WATCHBRIDGE_HTTP_URL", format!("{feeds}/feeds/{{/id}}"))
        .env("WATCHBRIDGE_HTTP_ITEMS", "/items")
        .env("WATCHBRIDGE_HTTP_ITEM_KEY", "/id")
        .env("WATCHBRIDGE_HTTP_ITEM_TIME", "/time")
        .env("WATCHBRIDGE_HTTP_COMPLETE", "/complete")
        .env("WATCHBRIDGE_POLL_INTERVAL", "1s")
        .env("WATCHBRIDGE_METRICS_ADDR", "off")
        .env(
            "WATCHBRIDGE_LOG",
            std::env::var(log_var).unwrap_or_else(|_| "warn".into()),
        );
    c
}

/// Starts `command` with stdin closed and stdout and stderr appended to `log`, after a
/// first line with the time it was spawned (UTC, as the job's own log lines): the start of
/// a start-up timeline read from a kept log (`BENCH_KEEP_LOGS=1`).
pub fn spawn_logged(mut command: Command, what: &str, log: &Path) -> Child {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the job's log");
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
    writeln!(log, "{now} (bench) spawning {what}").expect("write the job's log");
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"))
}

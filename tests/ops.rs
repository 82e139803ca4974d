//! Operating the bridge, as a probe, a scraper and a log collector see it: the real binary
//! against a real broker (Tansu), its `/healthz`, `/readyz` and `/metrics` read over HTTP,
//! its JSON log lines parsed.

mod support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::{Seen, TestServer};
use support::ops_client::{sample_value, Ops};
use support::scenario::{
    assert_each_once, feeds, finished_feeds, free_port, output_key_counts, outputs_to_end,
    produce_user_to, user_output_keys, wait_for_outputs, Setup,
};

/// The bridge's settings for `s`, its operations server on `port`.
/// A way to the test broker that holds every connection until opened: a bridge given it as
/// its bootstrap cannot reach the cluster, and so cannot be ready, until the test says
/// (once it has the cluster's metadata, a client talks to the broker's own address).
struct BrokerGate {
    addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
}

impl BrokerGate {
    async fn start() -> Self {
        let upstream = support::kafka::broker().bootstrap().to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, opened) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut opened = opened.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if opened.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    if let Ok(mut broker) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                    }
                });
            }
        });
        Self { addr, open }
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

fn env_on(s: &Setup, server: &TestServer, port: u16) -> Vec<(&'static str, String)> {
    let mut env = s.env(server);
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    env
}

/// The bridge's operations server.
impl Ops {
    async fn wait_for_metric(
        &self,
        bridge: &Bridge,
        sample: &str,
        within: Duration,
        done: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let value = self.metric(sample).await;
            if let Some(v) = value.filter(|v| done(*v)) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{sample} is {value:?}; metrics:\n{}\nbridge log:\n{}",
                self.get("/metrics").await.unwrap_or_default().1,
                bridge.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The log's lines, each a JSON object (panics on any other line).
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn count(log: &str, text: &str) -> usize {
    log.matches(text).count()
}

/// One bridge through its life: `/healthz` answers while it starts; `/readyz` says 503
/// until both partitions are assigned and restored, then 200, and 503 "stopping" once
/// SIGTERM arrives; `/metrics` counts exactly the outputs read back from the output topic,
/// and shows librdkafka's statistics; every log line is JSON, without the secret.
#[tokio::test(flavor = "multi_thread")]
async fn probes_metrics_and_json_logs_follow_the_bridge_through_its_life() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("ops", 2).await;
    let port = free_port();
    let mut env = env_on(&s, &server, port);
    env.extend([
        ("KAFKA_STATISTICS_INTERVAL_MS", "500".to_string()),
        ("WATCHBRIDGE_LOG_FORMAT", "json".to_string()),
        // The statistics' own events are at trace.
        (
            "WATCHBRIDGE_LOG",
            "info,librdkafka=warn,rdkafka=warn,watchbridge::internal_events=trace".to_string(),
        ),
        // Unused with plaintext, but logged at start: masked.
        ("KAFKA_SASL_PASSWORD", "hunter2-ops".to_string()),
    ]);
    // The cluster out of reach until the probes said "not ready": a start that reaches it is
    // ready within a tenth of a second, before a first answer here would come.
    let gate = BrokerGate::start().await;
    env.push(("WATCHBRIDGE_BROKERS", gate.addr.to_string()));
    let started = Instant::now();
    let mut bridge = Bridge::spawn(&env);
    let ops = Ops::new(port);

    // Alive at once, long before the group has assigned anything.
    let health = ops
        .wait_until(&bridge, "/healthz", Duration::from_secs(20), |a| {
            a.is_some()
        })
        .await;
    assert_eq!(health, Some((200, "ok\n".into())));
    let answered_after = started.elapsed();
    let (status, body) = ops.get("/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: "), "{body}");
    assert_eq!(ops.metric("watchbridge_ready").await, Some(0.0));
    gate.open();

    // Ready only once both partitions are restored.
    let mut not_ready_seen = 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = ops.get("/readyz").await.unwrap();
        let log = bridge.log();
        if status == 200 {
            // With auto's fallback to recovery (Tansu), a line says why.
            assert!(
                body == "ready\n"
                    || body.starts_with(
                        "ready\nguarantee: recovery (WATCHBRIDGE_GUARANTEE=auto fell back: the brokers"
                    ),
                "{body}"
            );
            assert_eq!(count(&log, "partition state restored"), 2, "{log}");
            break;
        }
        assert_eq!(status, 503, "{body}");
        not_ready_seen += 1;
        assert!(Instant::now() < deadline, "never ready:\n{log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "/healthz after {answered_after:.1?}, ready after {:.1?} ({not_ready_seen} answers 503)",
        started.elapsed()
    );
    assert_eq!(ops.metric("watchbridge_ready").await, Some(1.0));
    assert_eq!(
        ops.metric("watchbridge_partitions_recovering").await,
        Some(0.0)
    );
    assert_eq!(
        ops.metric("watchbridge_partitions_assigned").await,
        Some(2.0)
    );

    // What reached the output topic is what the metrics count.
    // Two users on each partition, so that both have a position to measure lag from.
    for user in 1..=4 {
        produce_user_to(&s.input, Some((user % 2) as i32), user).await;
    }
    wait_for_outputs(&s.output, 8, Duration::from_secs(60)).await;
    // (That they are all, once each, is checked on the topic read to its end, below.)
    ops.wait_for_metric(
        &bridge,
        "watchbridge_outputs_produced_total",
        Duration::from_secs(30),
        |v| v == 8.0,
    )
    .await;
    assert_eq!(
        ops.metric("watchbridge_inputs_consumed_total").await,
        Some(4.0)
    );
    assert_eq!(
        ops.metric("watchbridge_outputs_emitted_total").await,
        Some(8.0)
    );
    assert_eq!(
        ops.metric("watchbridge_watches_terminated_total{reason=\"final\"}")
            .await,
        Some(4.0)
    );

    // librdkafka's statistics, every 500 ms: the consumer's lag per assigned partition
    // (nothing left to read once the inputs are committed), the producer's queue.
    for partition in 0..2 {
        ops.wait_for_metric(
            &bridge,
            &format!("watchbridge_consumer_lag_messages{{partition=\"{partition}\"}}"),
            Duration::from_secs(30),
            |lag| lag == 0.0,
        )
        .await;
    }
    let (_, text) = ops.get("/metrics").await.unwrap();
    assert!(sample_value(&text, "watchbridge_producer_queue_messages").is_some());
    let log = bridge.log();
    let lines = json_lines(&log);
    let producer_statistics = lines
        .iter()
        .find(|l| l["message"] == "producer statistics")
        .unwrap_or_else(|| panic!("no producer statistics:\n{log}"));
    assert!(producer_statistics["queued_messages"].is_u64());

    // JSON lines, fields at the top level, the secret masked.
    let starting = lines
        .iter()
        .find(|l| l["message"] == "bridge starting")
        .unwrap();
    assert_eq!(starting["input"], s.input.as_str());
    assert_eq!(starting["level"], "INFO");
    let serving = lines
        .iter()
        .find(|l| {
            l["message"]
                == "serving /metrics, /healthz, /readyz and /version (WATCHBRIDGE_METRICS_ADDR)"
        })
        .unwrap();
    assert_eq!(serving["address"], format!("127.0.0.1:{port}"));
    assert!(lines.iter().any(|l| l["value"] == "<redacted>"), "{log}");
    assert!(!log.contains("hunter2-ops"));

    // Stopping: not ready any more from the signal on; the server goes with the process.
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    let lines = json_lines(&bridge.log());
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "not ready" && l["reason"] == "stopping"),
        "{}",
        bridge.log()
    );
    assert_eq!(ops.get("/healthz").await, None);
    // Stopped, the output topic holds everything it wrote: the 8 outputs the metrics
    // counted, once each.
    let all = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&all),
        user_output_keys(1..=4),
        &bridge.log(),
    );
}

/// More instances than partitions: the one without a partition is a healthy standby, ready,
/// and writes no merged watermark.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_without_partitions_is_ready() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("standby", 1).await;
    let (port_a, port_b) = (free_port(), free_port());
    let first = Bridge::start(&env_on(&s, &server, port_a));
    let first_ops = Ops::new(port_a);
    first_ops
        .wait_until(&first, "/readyz", Duration::from_secs(60), |a| {
            a.is_some_and(|(status, _)| *status == 200)
        })
        .await;
    let second = Bridge::start(&env_on(&s, &server, port_b));
    let second_ops = Ops::new(port_b);
    second_ops
        .wait_until(&second, "/readyz", Duration::from_secs(60), |a| {
            a.is_some_and(|(status, _)| *status == 200)
        })
        .await;
    let (a, b) = (
        first_ops
            .metric("watchbridge_partitions_assigned")
            .await
            .unwrap(),
        second_ops
            .metric("watchbridge_partitions_assigned")
            .await
            .unwrap(),
    );
    assert_eq!(
        (a, b),
        (1.0, 0.0),
        "the first keeps the partition (cooperative-sticky):\n{}",
        second.log()
    );
    let (status, body) = first_ops.get("/readyz").await.unwrap();
    assert!(
        status == 200 && body.starts_with("ready\n"),
        "{status} {body}"
    );
    // One writer of the merged watermark: the owner of input partition 0, restored.
    first_ops
        .wait_for_metric(
            &first,
            "watchbridge_merged_watermark_writer",
            Duration::from_secs(10),
            |v| v == 1.0,
        )
        .await;
    assert_eq!(
        second_ops
            .metric("watchbridge_merged_watermark_writer")
            .await,
        Some(0.0),
        "{}",
        second.log()
    );
}

/// A bounded run is ready once it has assigned itself every partition and restored them,
/// and stops being ready when it is done.
#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_run_is_ready_while_it_works() {
    // Feeds that never say final: each watch runs for its `total(2s)`.
    let server = TestServer::start(|seen: &Seen| feeds(seen, false)).await;
    let s = Setup::new("bounded", 2).await;
    for user in 1..=2 {
        produce_user_to(&s.input, Some((user % 2) as i32), user).await;
    }
    let port = free_port();
    let mut env = env_on(&s, &server, port);
    env.extend([
        ("WATCHBRIDGE_MODE", "bounded".to_string()),
        ("WATCHBRIDGE_TERMINATION", "total(2s)".to_string()),
    ]);
    let mut bridge = Bridge::spawn(&env);
    let ops = Ops::new(port);
    ops.wait_until(&bridge, "/readyz", Duration::from_secs(60), |a| {
        a.is_some_and(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(
        count(&bridge.log(), "partition state restored"),
        2,
        "{}",
        bridge.log()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = bridge.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{}", bridge.log());
    let log = bridge.log();
    assert!(log.contains("bounded run complete"), "{log}");
    assert!(log.contains("not ready"), "{log}");
    assert_eq!(ops.get("/readyz").await, None);
}

/// Liveness sees a stalled engine: partition 1's engine stops turning once it has a watch
/// (`WATCHBRIDGE_TEST_STALL_ENGINE`, a hook of debug builds that stands for a deadlock), and
/// `/healthz` fails within WATCHBRIDGE_STALL_TIMEOUT, naming the partition; the other
/// partition's engine, and an idle instance, keep `/healthz` at 200.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_engine_fails_liveness() {
    let server = TestServer::start(|seen: &Seen| feeds(seen, false)).await;
    let s = Setup::new("stall", 2).await;
    let port = free_port();
    let mut env = env_on(&s, &server, port);
    env.extend([
        ("WATCHBRIDGE_STALL_TIMEOUT", "2s".to_string()),
        ("WATCHBRIDGE_TEST_STALL_ENGINE", "1".to_string()),
        ("WATCHBRIDGE_POLL_INTERVAL", "200ms".to_string()),
    ]);
    let mut bridge = Bridge::spawn(&env);
    let ops = Ops::new(port);
    ops.wait_until(&bridge, "/readyz", Duration::from_secs(60), |a| {
        a.is_some_and(|(status, _)| *status == 200)
    })
    .await;
    // Partition 0's watch works; nothing is stalled.
    produce_user_to(&s.input, Some(0), 1).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ops.get("/healthz").await.map(|a| a.0), Some(200));
    // Partition 1's engine takes a watch, and stops turning.
    produce_user_to(&s.input, Some(1), 2).await;
    let (_, body) = ops
        .wait_until(&bridge, "/healthz", Duration::from_secs(30), |a| {
            a.is_some_and(|(status, _)| *status == 503)
        })
        .await
        .unwrap();
    assert!(body.contains("input partition 1"), "{body}");
    assert!(body.contains("WATCHBRIDGE_STALL_TIMEOUT"), "{body}");
    let _ = bridge.child.kill();
    let _ = bridge.child.wait();
}

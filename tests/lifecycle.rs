//! Starting and stopping the real bridge while the brokers are away (issue 15, paths 11 and
//! 12): a start beside a broker that is not up yet waits for it (serving `/healthz`, not
//! ready on `/readyz`) and gives up only after `WATCHBRIDGE_START_TIMEOUT`; a broker outage
//! is logged once when it begins and once when it ends; a stop with the broker gone or
//! paused ends within `WATCHBRIDGE_SHUTDOWN_TIMEOUT` plus its stated margin, saying what was
//! not delivered or committed.
//!
//! Every test that takes a broker away runs its own ([`Broker::own`]), so the tests of this
//! binary never share one (and the shared `broker()` is never started).

mod support;

use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::Broker;
use support::ops_client::Ops;
use support::scenario::{data_records, finished_feeds, free_port, T0};

/// `WATCHBRIDGE_SHUTDOWN_TIMEOUT` as `Bridge::spawn` sets it.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// The margin past `WATCHBRIDGE_SHUTDOWN_TIMEOUT` that the docs state for a stop.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// `n` distinct free loopback ports.
fn free_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < n {
        let p = free_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}

fn count(log: &str, text: &str) -> usize {
    log.lines().filter(|l| l.contains(text)).count()
}

/// Feeds that never end and grow by one item on every request, so a running watch always
/// has something new to emit (and, with the broker away, something not delivered).
fn growing_feeds() -> impl Fn(&support::http_server::Seen) -> Reply + Send + Sync + 'static {
    let requests = Arc::new(AtomicU64::new(0));
    move |seen| {
        let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
        let n = requests.fetch_add(1, Ordering::Relaxed) as i64;
        // One new item per request: a few outputs a second over all watches, little
        // enough for Tansu (SQLite) to catch up with after an outage.
        Reply::json(json!({
            "events": [{"id": format!("u{user}-{n}"), "at": T0 + n}],
            "done": false,
        }))
    }
}

/// The bridge's settings against `brokers`, its poller on `server`.
fn env(brokers: &str, name: &str, server: &TestServer) -> Vec<(&'static str, String)> {
    vec![
        ("WATCHBRIDGE_BROKERS", brokers.to_string()),
        ("WATCHBRIDGE_INPUT_TOPIC", format!("{name}-in")),
        ("WATCHBRIDGE_OUTPUT_TOPIC", format!("{name}-out")),
        ("WATCHBRIDGE_GROUP_ID", format!("{name}-group")),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}/events")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
    ]
}

async fn produce_users(broker: &Broker, topic: &str, users: std::ops::RangeInclusive<i64>) {
    for user in users {
        broker
            .produce(
                topic,
                None,
                Some(format!("user-{user}").as_bytes()),
                json!({"id": user}).to_string().as_bytes(),
                &[],
            )
            .await;
    }
}

/// A bridge against a broker of its own, with live watches that keep emitting: `users`
/// inputs, and their first outputs on the output topic.
async fn running_bridge(
    broker: &Broker,
    name: &str,
    server: &TestServer,
    extra: &[(&'static str, String)],
) -> Bridge {
    let input = format!("{name}-in");
    broker.create_topic(&input, 4).await;
    let mut env = env(broker.bootstrap(), name, server);
    env.extend(extra.iter().cloned());
    let bridge = Bridge::start(&env);
    bridge.wait_for_log("ready: partitions assigned", Duration::from_secs(60));
    produce_users(broker, &input, 1..=4).await;
    wait_for_outputs(broker, &format!("{name}-out"), 8, Duration::from_secs(60)).await;
    bridge
}

/// How many output records (watermark records not counted) a 2 s read of `topic`'s 4
/// partitions finds; a broker that does not answer yet reads as none (unlike the fixture's
/// readers, which panic: a broker just restarted may be slow to answer at first).
fn count_outputs(broker: &Broker, topic: &str) -> usize {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let Ok(consumer) = broker
        .config()
        .set("group.id", "lifecycle-count")
        .set("enable.auto.commit", "false")
        .create::<BaseConsumer>()
    else {
        return 0;
    };
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..4 {
        let _ = tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning);
    }
    if consumer.assign(&tpl).is_err() {
        return 0;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut read = Vec::new();
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            read.push(m.detach());
        }
    }
    data_records(read).len()
}

/// Wait until `n` output records (watermark records not counted) are on `topic`.
async fn wait_for_outputs(broker: &Broker, topic: &str, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let read = data_records(broker.read_to_end(topic).await);
        if read.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            Instant::now() < deadline,
            "{} of {n} outputs on {topic} within {within:?}",
            read.len()
        );
    }
}

/// SIGCONT for a SIGSTOPped broker, however the test ends (before the broker is dropped,
/// whose stop would otherwise wait for its SIGKILL).
struct Paused<'a>(&'a Broker);

impl Paused<'_> {
    fn pause(broker: &Broker) -> Paused<'_> {
        signal(broker, "-STOP");
        Paused(broker)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(broker: &Broker, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &broker.pid()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {}", broker.pid());
}

/// SIGTERM, and the stop must end within the shutdown timeout plus the stated margin, with
/// exit code 3 and a log line that says what was left undelivered or uncommitted.
fn assert_stop_gives_up_in_time(bridge: &mut Bridge, what: &str) -> Duration {
    let ended = bridge.terminate_within(Duration::from_secs(60));
    let (code, took) = match ended {
        Ok(ended) => ended,
        Err(running) => panic!(
            "{what}: the bridge was still running {running:?} after SIGTERM \
             (WATCHBRIDGE_SHUTDOWN_TIMEOUT={SHUTDOWN_TIMEOUT:?}); its log:\n{}",
            bridge.log()
        ),
    };
    let log = bridge.log();
    eprintln!("{what}: the stop took {took:?}, exit code {code:?}");
    assert!(
        took < SHUTDOWN_TIMEOUT + STOP_MARGIN,
        "{what}: the stop took {took:?}, more than {SHUTDOWN_TIMEOUT:?} + {STOP_MARGIN:?}:\n{log}"
    );
    assert_eq!(
        code,
        Some(3),
        "{what}: a stop that gave up exits with 3:\n{log}"
    );
    assert_eq!(
        count(&log, "the stop gave up"),
        1,
        "{what}: one line says what the stop left:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("the stop gave up"))
        .unwrap();
    eprintln!("{what}: {line}");
    assert!(
        line.contains("not delivered") && line.contains("not committed"),
        "{what}: it says what was not delivered and not committed: {line}"
    );
    took
}

/// The broker process is gone (SIGKILL) while the bridge runs live watches; SIGTERM then
/// ends the bridge within the timeout and margin (it used to wait forever for librdkafka to
/// close the consumer group), exit code 3, one line saying what it left.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_with_the_broker_gone_ends_within_the_shutdown_timeout() {
    let broker = Broker::own();
    let server = TestServer::start(growing_feeds()).await;
    let mut bridge = running_bridge(&broker, "stop-gone", &server, &[]).await;
    broker.kill();
    let took = assert_stop_gives_up_in_time(&mut bridge, "broker killed");
    let log = bridge.log();
    assert!(
        count(&log, "AllBrokersDown") <= 1,
        "librdkafka's AllBrokersDown is reported once at most, in the outage line:\n{log}"
    );
    eprintln!("stop with the broker killed: {took:?}");
}

/// The broker is paused (SIGSTOP: connections stay open, requests time out) while the
/// bridge runs live watches; SIGTERM ends the bridge within the timeout and margin.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_with_the_broker_paused_ends_within_the_shutdown_timeout() {
    let broker = Broker::own();
    let server = TestServer::start(growing_feeds()).await;
    let mut bridge = running_bridge(&broker, "stop-paused", &server, &[]).await;
    let paused = Paused::pause(&broker);
    let took = assert_stop_gives_up_in_time(&mut bridge, "broker paused");
    drop(paused);
    eprintln!("stop with the broker paused: {took:?}");
}

/// An outage while the bridge runs is logged once when every broker is lost and once when
/// one answers again (not on every librdkafka report), counted in
/// `watchbridge_broker_outages_total` and shown by `watchbridge_brokers_reachable`; the
/// bridge then goes on, and stops in order (exit 0).
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_is_logged_once_when_it_begins_and_once_when_it_ends() {
    let broker = Broker::own();
    let server = TestServer::start(growing_feeds()).await;
    let port = free_port();
    let extra = [("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}"))];
    let mut bridge = running_bridge(&broker, "outage", &server, &extra).await;
    let ops = Ops::new(port);
    assert_eq!(ops.metric("watchbridge_brokers_reachable").await, Some(1.0));

    let before = bridge.log().lines().count();
    broker.kill();
    bridge.wait_for_log("every broker is unreachable", Duration::from_secs(30));
    assert_eq!(ops.metric("watchbridge_brokers_reachable").await, Some(0.0));
    // Down for a while: librdkafka keeps reporting the lost connections meanwhile, several
    // times a second over all the bridge's clients; none of it may reach the log at info.
    tokio::time::sleep(Duration::from_secs(6)).await;
    broker.start_again();
    bridge.wait_for_log("brokers reachable again", Duration::from_secs(60));

    let log = bridge.log();
    assert_eq!(count(&log, "every broker is unreachable"), 1, "{log}");
    assert_eq!(count(&log, "brokers reachable again"), 1, "{log}");
    assert!(count(&log, "AllBrokersDown") <= 1, "{log}");
    assert_eq!(count(&log, "consumer error"), 0, "{log}");
    // From the kill to the end of the outage: the first lost connections (one line per
    // kind, before the outage is confirmed) and the outage's own two lines, no more.
    let outage: Vec<&str> = log
        .lines()
        .skip(before)
        .take_while(|l| !l.contains("brokers reachable again"))
        .collect();
    let librdkafka = outage
        .iter()
        .filter(|l| l.contains("librdkafka") || l.contains("rdkafka::"))
        .count();
    assert!(
        librdkafka <= 4,
        "{librdkafka} librdkafka lines during the outage: it is one event, not a line per \
         report:\n{}",
        outage.join("\n")
    );
    assert_eq!(
        ops.metric("watchbridge_broker_outages_total").await,
        Some(1.0)
    );
    assert_eq!(ops.metric("watchbridge_brokers_reachable").await, Some(1.0));

    // It goes on: in the exactly-once mode (Kafka), each partition whose transaction the
    // outage aborted starts again from its last commit (its abort can only end once the
    // broker is back); then new outputs arrive, and it stops in order.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = bridge.log();
        let since: Vec<&str> = log.lines().skip(before).collect();
        let aborted = since
            .iter()
            .filter(|l| l.contains("transaction aborted"))
            .count();
        let restarted = since
            .iter()
            .filter(|l| l.contains("restarting the partition from its last committed"))
            .count();
        if restarted >= aborted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{aborted} transactions aborted, {restarted} partitions restarted:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ops.wait_for(&bridge, "/readyz", 200, Duration::from_secs(60))
        .await;
    let seen = count_outputs(&broker, "outage-out");
    let deadline = Instant::now() + Duration::from_secs(90);
    while count_outputs(&broker, "outage-out") <= seen {
        assert!(
            Instant::now() < deadline,
            "no new output after the outage ({seen} before):\n{}",
            bridge.log()
        );
    }
    let (code, took) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    assert!(took < SHUTDOWN_TIMEOUT + STOP_MARGIN, "{took:?}");
}

/// Started beside a broker that is not up yet, the bridge waits: `/healthz` answers 200,
/// `/readyz` 503 naming what it waits for, `watchbridge_brokers_reachable` is 0, and the
/// log says once that it waits (each try is a debug line); once a broker listens where it
/// looks, it starts, becomes ready and works.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_waits_for_brokers_that_are_not_up_yet() {
    let server = TestServer::start(finished_feeds).await;
    let ports = free_ports(Broker::ports_needed());
    let brokers = format!("127.0.0.1:{}", ports[0]);
    let ops_port = free_port();
    let mut env = env(&brokers, "late-broker", &server);
    env.extend([
        ("WATCHBRIDGE_START_TIMEOUT", "3m".to_string()),
        ("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{ops_port}")),
        (
            "WATCHBRIDGE_LOG",
            "info,librdkafka=warn,rdkafka=warn,watchbridge::internal_events=debug".to_string(),
        ),
    ]);
    let bridge_started = Instant::now();
    let mut bridge = Bridge::spawn(&env);
    let ops = Ops::new(ops_port);

    let health = ops
        .wait_for(&bridge, "/healthz", 200, Duration::from_secs(20))
        .await;
    assert_eq!(health.trim(), "ok");
    let (status, body) = ops.get("/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    bridge.wait_for_log("waiting for the brokers", Duration::from_secs(20));
    let (status, body) = ops.get("/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains(&brokers),
        "/readyz says what it waits for: {body}"
    );
    assert_eq!(ops.metric("watchbridge_brokers_reachable").await, Some(0.0));
    // Several tries, with backoff, each a debug line only.
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&bridge.log(), "the brokers did not answer yet") < 3 {
        assert!(
            bridge.child.try_wait().unwrap().is_none(),
            "the bridge gave up:\n{}",
            bridge.log()
        );
        assert!(Instant::now() < deadline, "{}", bridge.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let waited = Instant::now();
    let broker = Broker::own_on(&ports);
    ops.wait_for(&bridge, "/readyz", 200, Duration::from_secs(120))
        .await;
    eprintln!("ready {:?} after the broker answered", waited.elapsed());
    // Said once, then once every 30 s at most (Kafka's JVM can take that long).
    let log = bridge.log();
    assert_eq!(
        count(
            &log,
            "waiting for the brokers to answer (WATCHBRIDGE_BROKERS); trying again"
        ),
        1,
        "{log}"
    );
    let reminders = count(&log, "still waiting for the brokers");
    let waited = bridge_started.elapsed().as_secs() as usize;
    assert!(
        reminders <= waited / 30,
        "{reminders} reminders in {waited} s:\n{log}"
    );
    assert_eq!(count(&log, "brokers answered"), 1, "{log}");
    assert_eq!(ops.metric("watchbridge_brokers_reachable").await, Some(1.0));

    // And it works: an input's outputs arrive.
    produce_users(&broker, "late-broker-in", 1..=1).await;
    wait_for_outputs(&broker, "late-broker-out", 2, Duration::from_secs(60)).await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
}

/// With no broker at all, the start gives up after `WATCHBRIDGE_START_TIMEOUT`, not before
/// and not much after, with exit code 1 and an error naming the setting and the brokers.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_gives_up_after_the_start_timeout() {
    let server = TestServer::start(finished_feeds).await;
    let brokers = format!("127.0.0.1:{}", free_port());
    let mut env = env(&brokers, "no-broker", &server);
    env.push(("WATCHBRIDGE_START_TIMEOUT", "3s".to_string()));
    let started = Instant::now();
    let mut bridge = Bridge::spawn(&env);
    let (code, took) = bridge
        .wait_for_exit(started, Duration::from_secs(60))
        .unwrap_or_else(|t| panic!("still running after {t:?}:\n{}", bridge.log()));
    let log = bridge.log();
    eprintln!("gave up after {took:?}");
    assert_eq!(code, Some(1), "{log}");
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(3) + Duration::from_secs(7),
        "gave up after {took:?}, not about 3 s:\n{log}"
    );
    let error = log
        .lines()
        .find(|l| l.contains("WATCHBRIDGE_START_TIMEOUT"))
        .unwrap_or_else(|| panic!("no line names WATCHBRIDGE_START_TIMEOUT:\n{log}"));
    assert!(
        error.contains(&brokers) && error.contains("WATCHBRIDGE_BROKERS"),
        "{error}"
    );
}

/// SIGTERM while the start still waits for the brokers ends it at once, in order (exit 0):
/// nothing was read, so there is nothing to deliver or commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_while_the_start_waits_ends_at_once() {
    let server = TestServer::start(finished_feeds).await;
    let brokers = format!("127.0.0.1:{}", free_port());
    let mut env = env(&brokers, "stop-waiting", &server);
    env.push(("WATCHBRIDGE_START_TIMEOUT", "5m".to_string()));
    let mut bridge = Bridge::spawn(&env);
    bridge.wait_for_log("waiting for the brokers", Duration::from_secs(20));
    let (code, took) = bridge
        .terminate_within(Duration::from_secs(60))
        .unwrap_or_else(|t| panic!("still running {t:?} after SIGTERM:\n{}", bridge.log()));
    eprintln!("a stop during the start's wait took {took:?}");
    assert_eq!(code, Some(0), "{}", bridge.log());
    assert!(took < Duration::from_secs(3), "{took:?}:\n{}", bridge.log());
}

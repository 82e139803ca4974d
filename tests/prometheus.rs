//! The bridge's metrics as an operator sees them: a real Prometheus server (Debian's
//! `prometheus` package, installed by `make setup`) scrapes `/metrics`, and the tests ask
//! its HTTP API, as a dashboard or an alert would.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::{Body, Reply, Seen, TestServer};
use support::prometheus::Prometheus;
use support::scenario::{
    assert_each_once, finished_feeds, free_port, now_ms, output_key_counts, outputs_to_end,
    produce_user, user_output_keys, wait_for_outputs, Setup,
};

/// How long Prometheus may take to show a change: a scrape each second, plus slack for a
/// slow machine.
const SCRAPED: Duration = Duration::from_secs(30);

/// A `/metrics` answer in the text exposition format.
fn exposition(text: String) -> Reply {
    Reply {
        status: 200,
        headers: vec![(
            "content-type",
            "text/plain; version=0.0.4; charset=utf-8".into(),
        )],
        body: Body::Bytes(text.into_bytes()),
        delay: Duration::ZERO,
    }
}

/// The fixture itself, against a fixed page: Prometheus scrapes it, and a counter, a
/// labelled counter and the histogram quantile the bridge test uses come back as served.
#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_a_metrics_page_and_answers_queries_about_it() {
    // The histogram gains one observation per scrape, so its rate is not zero.
    let scrapes = Arc::new(AtomicU64::new(0));
    let counted = scrapes.clone();
    let server = TestServer::start(move |seen: &Seen| {
        if seen.target != "/metrics" {
            return Reply::status(404, "");
        }
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        exposition(format!(
            "# HELP watchbridge_outputs_produced_total Output records acknowledged by the broker\n\
             # TYPE watchbridge_outputs_produced_total counter\n\
             watchbridge_outputs_produced_total 7\n\
             # TYPE watchbridge_watches_terminated_total counter\n\
             watchbridge_watches_terminated_total{{reason=\"final\"}} 3\n\
             watchbridge_watches_terminated_total{{reason=\"stable\"}} 1\n\
             # TYPE watchbridge_poll_duration_seconds histogram\n\
             watchbridge_poll_duration_seconds_bucket{{result=\"ok\",le=\"0.01\"}} 0\n\
             watchbridge_poll_duration_seconds_bucket{{result=\"ok\",le=\"0.1\"}} {n}\n\
             watchbridge_poll_duration_seconds_bucket{{result=\"ok\",le=\"+Inf\"}} {n}\n\
             watchbridge_poll_duration_seconds_sum{{result=\"ok\"}} {}\n\
             watchbridge_poll_duration_seconds_count{{result=\"ok\"}} {n}\n",
            n as f64 * 0.05
        ))
    })
    .await;
    let prometheus = Prometheus::start("fixed", &[server.addr.to_string()]).await;

    let targets = prometheus.targets_up(SCRAPED).await;
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(targets[0].job, "fixed");
    assert_eq!(targets[0].scrape_url, server.url("/metrics"));
    assert_eq!(targets[0].last_error, "");

    let produced = prometheus
        .wait_for_value("watchbridge_outputs_produced_total", |v| v == 7.0, SCRAPED)
        .await;
    assert_eq!(produced, 7.0);
    let series = prometheus.query("watchbridge_outputs_produced_total").await;
    assert_eq!(series.len(), 1);
    let (labels, value) = &series[0];
    assert_eq!(value, &7.0);
    assert_eq!(labels["__name__"], "watchbridge_outputs_produced_total");
    assert_eq!(labels["job"], "fixed");
    assert_eq!(labels["instance"], server.addr.to_string());

    let up = prometheus.query("up{job=\"fixed\"}").await;
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].1, 1.0);

    let mut by_reason: Vec<(String, f64)> = prometheus
        .query("sum by (reason) (watchbridge_watches_terminated_total)")
        .await
        .into_iter()
        .map(|(labels, v)| (labels["reason"].clone(), v))
        .collect();
    by_reason.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(by_reason, [("final".into(), 3.0), ("stable".into(), 1.0)]);
    assert_eq!(
        prometheus
            .query("sum(watchbridge_watches_terminated_total)")
            .await[0]
            .1,
        4.0
    );

    // Every observation fell in (0.01, 0.1]: the 99th percentile interpolates to 0.0991.
    let p99 = prometheus
        .wait_for_value(
            "histogram_quantile(0.99, sum by (le) (rate(watchbridge_poll_duration_seconds_bucket[30s])))",
            f64::is_finite,
            SCRAPED,
        )
        .await;
    assert!((p99 - 0.0991).abs() < 1e-9, "{p99}");

    // A series nobody exports is an empty vector; a scalar expression one unlabelled value.
    assert!(prometheus
        .query("watchbridge_no_such_metric")
        .await
        .is_empty());
    assert_eq!(prometheus.query("1 + 1").await, [(Default::default(), 2.0)]);
    assert!(scrapes.load(Ordering::SeqCst) >= 2);
}

/// The operations issue's proof: the bridge against the real broker, scraped by a real
/// Prometheus, whose key series agree with what the test consumed.
#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_bridge_and_its_series_match_what_was_consumed() {
    const PARTITIONS: i32 = 2;
    const USERS: i64 = 6;
    let started_ms = now_ms();
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("prometheus", PARTITIONS).await;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_METRICS_ADDR", metrics_addr.clone()));
    // A partition no user lands on must not hold the merged watermark back for long.
    env.push(("WATCHBRIDGE_IDLE_TIMEOUT", "2s".into()));
    let mut bridge = Bridge::start(&env);
    let log = LogOnPanic(&bridge);
    let prometheus = Prometheus::start("watchbridge", std::slice::from_ref(&metrics_addr)).await;
    let targets = prometheus.targets_up(SCRAPED).await;
    assert_eq!(
        targets[0].scrape_url,
        format!("http://{metrics_addr}/metrics")
    );
    let scraped = |expr: &'static str, want: f64| {
        prometheus.wait_for(expr, move |r| r.len() == 1 && r[0].1 == want, SCRAPED)
    };
    scraped("watchbridge_partitions_assigned", PARTITIONS as f64).await;
    // The build and the process, as every exporter has them.
    let build = prometheus.query("watchbridge_build_info").await;
    assert_eq!(build.len(), 1, "{build:?}");
    assert_eq!(build[0].0["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(build[0].1, 1.0);
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    ] {
        let series = prometheus.query(process).await;
        assert!(
            series.len() == 1 && series[0].1 > 0.0,
            "{process}: {series:?}"
        );
    }
    let started = prometheus.query("process_start_time_seconds").await;
    assert!(
        (started[0].1 * 1000.0 - started_ms as f64).abs() < 60_000.0,
        "process_start_time_seconds {started:?}, the test started at {started_ms} ms"
    );
    // No input yet, so no watermark: no series at all (not a sentinel value), which is
    // what the alert on a watermark that never came asks with `unless`.
    for none_yet in [
        "watchbridge_watermark_timestamp_seconds",
        "watchbridge_watermark_lag_seconds",
        "watchbridge_partition_watermark_timestamp_seconds",
    ] {
        assert_eq!(prometheus.query(none_yet).await, [], "{none_yet}");
    }

    // One user first, seen by Prometheus before the rest: the poll-duration histogram then
    // grows within the rate window, so its quantile is a number (a zero rate gives NaN).
    produce_user(&s.input, 1).await;
    prometheus
        .wait_for_value(
            "sum(watchbridge_poll_duration_seconds_count)",
            |v| v >= 1.0,
            Duration::from_secs(60),
        )
        .await;
    for user in 2..=USERS {
        produce_user(&s.input, user).await;
    }
    wait_for_outputs(&s.output, 2 * USERS as usize, Duration::from_secs(60)).await;
    // Two outputs per user; that they are once each is checked on the topic read to its
    // end once the bridge has stopped (below).
    let consumed = 2 * USERS as usize;

    scraped("watchbridge_outputs_produced_total", consumed as f64).await;
    scraped("watchbridge_inputs_consumed_total", USERS as f64).await;
    scraped("sum(watchbridge_watches_terminated_total)", USERS as f64).await;
    let by_reason: Vec<(String, f64)> = prometheus
        .query("sum by (reason) (watchbridge_watches_terminated_total)")
        .await
        .into_iter()
        .map(|(labels, v)| (labels["reason"].clone(), v))
        .collect();
    assert_eq!(
        by_reason,
        [("final".into(), USERS as f64)],
        "every feed said final"
    );
    scraped("watchbridge_partitions_assigned", PARTITIONS as f64).await;
    scraped("watchbridge_partitions_recovering", 0.0).await;

    // The merged watermark exists: input timestamps (produce time) less the 5 s bound, in
    // Unix seconds.
    let watermark = prometheus
        .wait_for_value(
            "watchbridge_watermark_timestamp_seconds * 1000",
            |v| v > 0.0,
            SCRAPED,
        )
        .await;
    assert!(
        watermark > (started_ms - 600_000) as f64 && watermark <= now_ms() as f64,
        "merged watermark {watermark}, test started at {started_ms}"
    );

    let p99 = prometheus
        .wait_for_value(
            "histogram_quantile(0.99, sum by (le) (rate(watchbridge_poll_duration_seconds_bucket[30s])))",
            f64::is_finite,
            SCRAPED,
        )
        .await;
    assert!(
        (0.0..=30.0).contains(&p99),
        "99th percentile poll duration {p99} s"
    );

    scraped("up{job=\"watchbridge\"}", 1.0).await;

    // Stopped, the output topic holds everything the bridge wrote: exactly what the series
    // counted, two outputs per user, once each.
    drop(log);
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let all = outputs_to_end(&s.output).await;
    assert_eq!(all.len(), consumed, "{}", bridge.log());
    assert_each_once(
        &output_key_counts(&all),
        user_output_keys(1..=USERS),
        &bridge.log(),
    );
}

/// Shows the bridge's log when the test fails.
struct LogOnPanic<'a>(&'a Bridge);

impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the bridge's log:\n{}", self.0.log());
        }
    }
}

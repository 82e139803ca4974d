//! Prometheus collectors, registered once on one registry.
//!
//! Nothing outside `internal_events.rs` touches these directly: an event there is both
//! logged and counted, so a metric and its log line cannot drift apart. Label values that
//! are hit on every poll are resolved once here, not per increment.

#[cfg(target_os = "linux")]
mod process;

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// A gauge that is not rendered at all until it has a value: "none yet" is an absent series
/// (which `absent()` and `unless` can ask about), not a sentinel value a graph would plot.
/// A label-less `GaugeVec`, whose one child the first `set` creates.
#[derive(Clone)]
pub struct OptionalGauge(GaugeVec);

impl OptionalGauge {
    pub fn set(&self, value: f64) {
        self.0.with_label_values::<&str>(&[]).set(value);
    }

    /// Back to no series.
    pub fn clear(&self) {
        let _ = self.0.remove_label_values::<&str>(&[]);
    }

    /// The value, if it has one.
    pub fn get(&self) -> Option<f64> {
        self.0
            .collect()
            .first()?
            .get_metric()
            .first()
            .map(|m| m.get_gauge().get_value())
    }
}

pub struct Metrics {
    pub registry: Registry,
    pub watches_active: IntGauge,
    pub watches_started: IntCounter,
    pub watches_duplicate_inputs: IntCounter,
    pub watches_terminated: IntCounterVec,
    pub polls_ok: IntCounter,
    pub polls_error: IntCounterVec,
    pub polls_deferred: IntCounter,
    pub retry_after_capped: IntCounter,
    pub poll_duration: HistogramVec,
    pub poll_lateness: Histogram,
    pub outputs_emitted: IntCounter,
    pub duplicates_suppressed: IntCounter,
    pub inputs_consumed: IntCounter,
    pub inputs_dead_lettered: IntCounterVec,
    pub outputs_produced: IntCounter,
    pub produce_failures: IntCounterVec,
    pub consumer_errors: IntCounterVec,
    pub partitions_assigned: IntGauge,
    /// Epoch seconds; a partition without a watermark has no series.
    pub partition_watermark: GaugeVec,
    /// Epoch seconds; absent until the merged watermark is known.
    pub watermark: OptionalGauge,
    /// Seconds; absent until the merged watermark is known.
    pub watermark_lag: OptionalGauge,
    pub late_outputs: IntCounter,
    pub outputs_past_retention: IntCounter,
    pub outputs_held_back: IntGauge,
    pub outputs_seen_silently: IntCounter,
    pub watches_restored: IntCounter,
    pub partitions_recovering: IntGauge,
    pub partitions_recovery_waiting: IntGauge,
    pub merged_watermark_writer: IntGauge,
    pub recovery_read_failures: IntCounterVec,
    pub recovery_duration: Histogram,
    pub outputs_recovered: IntCounter,
    pub inputs_finished: IntCounter,
    pub inputs_skipped: IntCounter,
    pub control_actions: IntCounterVec,
    pub polling_paused: IntGauge,
    pub failed_watches_restarted: IntCounter,
    pub state_records_written: IntCounter,
    pub transactions: IntCounterVec,
    pub partition_restarts: IntCounter,
    pub partition_restarts_delayed: IntCounterVec,
    pub instance_stalls: IntCounter,
    pub inputs_keyed_apart: IntCounter,
    pub inputs_repartitioned: IntCounter,
    pub transaction_commit_duration: Histogram,
    pub producer_queue_messages: IntGauge,
    pub consumer_lag: IntGaugeVec,
    pub ready: IntGauge,
    pub guarantee_info: IntGaugeVec,
    pub brokers_reachable: IntGauge,
    pub broker_outages: IntCounter,
    pub schema_registry_requests: IntCounterVec,
    pub schema_cache_size: IntGauge,
    pub outputs_dead_lettered: IntCounterVec,
    /// Every metric family name registered, with its type: what `/metrics` can show (a
    /// labelled family appears there once it has a child).
    names: Vec<(String, prometheus::proto::MetricType)>,
}

fn must<T>(what: &str, r: prometheus::Result<T>) -> T {
    // Only fails for a malformed name or a duplicate registration: a programming error in
    // this file, caught by the unit test below on every build.
    r.unwrap_or_else(|e| panic!("metric {what}: {e}"))
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let mut names = Vec::new();
        macro_rules! reg {
            ($c:expr) => {{
                let c = must(stringify!($c), $c);
                for desc in prometheus::core::Collector::desc(&c) {
                    names.push((desc.fq_name.clone(), metric_type(&c)));
                }
                must("register", registry.register(Box::new(c.clone())));
                c
            }};
        }
        let watches_active = reg!(IntGauge::new(
            "watchbridge_watches_active",
            "Watches currently running"
        ));
        let watches_started = reg!(IntCounter::new(
            "watchbridge_watches_started_total",
            "Watches started"
        ));
        let watches_duplicate_inputs = reg!(IntCounter::new(
            "watchbridge_inputs_already_watching_total",
            "Inputs whose key already had a running watch (re-deliveries); no second watch started"
        ));
        let watches_terminated = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_watches_terminated_total",
                "Watches ended, by reason (final, total, stable, polls, all, failed, stopped, or a custom name)"
            ),
            &["reason"]
        ));
        let polls = reg!(IntCounterVec::new(
            Opts::new("watchbridge_polls_total", "Polls completed, by result"),
            &["result", "error"]
        ));
        let polls_deferred = reg!(IntCounter::new(
            "watchbridge_polls_rate_limited_total",
            "Polls put back in the queue because their host's rate limit had no token"
        ));
        let retry_after_capped = reg!(IntCounter::new(
            "watchbridge_retry_after_capped_total",
            "Failed polls whose Retry-After asked for longer than WATCHBRIDGE_RETRY_AFTER_MAX"
        ));
        let poll_duration = reg!(HistogramVec::new(
            HistogramOpts::new(
                "watchbridge_poll_duration_seconds",
                "Time from starting a poll to its result"
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
            ]),
            &["result"]
        ));
        let poll_lateness =
            reg!(Histogram::with_opts(
            HistogramOpts::new(
                "watchbridge_poll_start_lateness_seconds",
                "How long after its scheduled time a poll started (queueing, concurrency limit)"
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0])
        ));
        let outputs_emitted = reg!(IntCounter::new(
            "watchbridge_outputs_emitted_total",
            "New outputs found by polls and handed on for producing"
        ));
        let duplicates_suppressed = reg!(IntCounter::new(
            "watchbridge_duplicates_suppressed_total",
            "Outputs a poll returned that the watch had already emitted"
        ));
        let inputs_consumed = reg!(IntCounter::new(
            "watchbridge_inputs_consumed_total",
            "Input records read from the input topic"
        ));
        let inputs_dead_lettered = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_inputs_dead_lettered_total",
                "Input records sent to the dead-letter topic, by reason (not_json, not_avro, not_string, unknown_schema, no_key, no_time, unresolvable, too_large)"
            ),
            &["reason"]
        ));
        let outputs_produced = reg!(IntCounter::new(
            "watchbridge_outputs_produced_total",
            "Output records acknowledged by the broker"
        ));
        let produce_failures = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_produce_failures_total",
                "Records the broker did not take, by error (what follows depends on the error: a record refused for itself is dead-lettered, a refusal of the principal restarts the partition after a backoff, anything else restarts it from its durable state)"
            ),
            &["error"]
        ));
        let consumer_errors = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_consumer_errors_total",
                "Errors the input consumer met other than a lost connection, by error (an ACL missing on the input topic or the group, a batch it cannot decode); /readyz says not ready until it reads again"
            ),
            &["error"]
        ));
        let partitions_assigned = reg!(IntGauge::new(
            "watchbridge_partitions_assigned",
            "Input partitions this instance owns"
        ));
        let partition_watermark = reg!(GaugeVec::new(
            Opts::new(
                "watchbridge_partition_watermark_timestamp_seconds",
                "Published watermark of each input partition this instance owns (Unix time in seconds; +Inf at the end of input; no series before its first watermark)"
            ),
            &["partition"]
        ));
        let watermark = OptionalGauge(reg!(GaugeVec::new(
            Opts::new(
                "watchbridge_watermark_timestamp_seconds",
                "Merged watermark over every input partition (Unix time in seconds; +Inf at the end of input; no series until there is one)"
            ),
            &[]
        )));
        let watermark_lag = OptionalGauge(reg!(GaugeVec::new(
            Opts::new(
                "watchbridge_watermark_lag_seconds",
                "Processing time minus the merged watermark, in seconds (updated every watermark interval; no series until there is a merged watermark)"
            ),
            &[]
        )));
        let late_outputs = reg!(IntCounter::new(
            "watchbridge_late_outputs_total",
            "Outputs emitted with an event time below their partition's published watermark (marked watchbridge-late)"
        ));
        let outputs_past_retention = reg!(IntCounter::new(
            "watchbridge_outputs_past_retention_total",
            "Outputs written with an event time older than the output topic's retention.ms: the broker deletes them at its next retention check"
        ));
        let outputs_held_back = reg!(IntGauge::new(
            "watchbridge_outputs_held_back",
            "New outputs watches hold back for their next polls (WATCHBRIDGE_MAX_OUTPUTS_PER_POLL)"
        ));
        let outputs_seen_silently = reg!(IntCounter::new(
            "watchbridge_outputs_seen_silently_total",
            "Outputs a watch's first poll recorded as seen without emitting them (WATCHBRIDGE_START_FROM=now)"
        ));
        let watches_restored = reg!(IntCounter::new(
            "watchbridge_watches_restored_total",
            "Watches brought back from the state topic (on assignment, after a restart or a rebalance)"
        ));
        let partitions_recovering = reg!(IntGauge::new(
            "watchbridge_partitions_recovering",
            "Assigned input partitions whose state is still being restored (they neither read inputs nor poll yet)"
        ));
        let partitions_recovery_waiting = reg!(IntGauge::new(
            "watchbridge_partitions_recovery_waiting",
            "Assigned input partitions whose recovery waits for a topic partition it cannot read (offline, no leader, timing out; /readyz names it)"
        ));
        let merged_watermark_writer = reg!(IntGauge::new(
            "watchbridge_merged_watermark_writer",
            "1 while this instance writes the merged watermark record (its task for input partition 0 runs with its state restored), else 0"
        ));
        let recovery_read_failures = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_recovery_read_failures_total",
                "Failed attempts of a partition's recovery to read what it needs (its state partition, the output partitions it writes to, the watermark topic), by input partition; each is tried again"
            ),
            &["partition"]
        ));
        let recovery_duration = reg!(Histogram::with_opts(
            HistogramOpts::new(
                "watchbridge_partition_recovery_seconds",
                "Time from a partition's assignment until its state is restored (state topic and output read-back)"
            )
            .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0])
        ));
        let outputs_recovered = reg!(IntCounter::new(
            "watchbridge_outputs_recovered_total",
            "Outputs found on the output topic by a recovery's read-back and added to seen sets (not emitted again)"
        ));
        let inputs_finished = reg!(IntCounter::new(
            "watchbridge_inputs_for_finished_watches_total",
            "Inputs whose watch already finished within WATCHBRIDGE_FINISHED_RETENTION (not started again)"
        ));
        let control_actions = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_control_actions_total",
                "Orders given to the control API, by action (stop, poll, pause, resume, restart, reset; refused: without the admin token)"
            ),
            &["action"]
        ));
        let polling_paused = reg!(IntGauge::new(
            "watchbridge_polling_paused",
            "1 while the group is paused (POST /pause to any instance, read from the control topic), else 0"
        ));
        let inputs_skipped = reg!(IntCounter::new(
            "watchbridge_inputs_skipped_total",
            "Inputs a library user's input filter said are not watches (markers): read and committed, no watch started"
        ));
        let failed_watches_restarted = reg!(IntCounter::new(
            "watchbridge_failed_watches_restarted_total",
            "Inputs whose watch had failed within WATCHBRIDGE_FINISHED_RETENTION: the watch started again, knowing the outputs it had found"
        ));
        let state_records_written = reg!(IntCounter::new(
            "watchbridge_state_records_written_total",
            "Records acknowledged by the state topic (watch records, seen chunks, output offsets, tombstones)"
        ));
        let partition_restarts = reg!(IntCounter::new(
            "watchbridge_partition_restarts_total",
            "Partitions started again from their durable state because an output's delivery failed and it may or may not be on the topic (WATCHBRIDGE_GUARANTEE recovery and at_least_once)"
        ));
        let instance_stalls = reg!(IntCounter::new(
            "watchbridge_instance_stalls_total",
            "Times the whole process stood still for half the group session timeout or more (SIGSTOP, a frozen VM): its partitions wrote nothing until the group confirmed them"
        ));
        let inputs_keyed_apart = reg!(IntCounter::new(
            "watchbridge_inputs_keyed_apart_total",
            "Inputs whose watch key (WATCHBRIDGE_WATCH_KEY) is not their record key: the same watch key may arrive on two input partitions and start two watches"
        ));
        let inputs_repartitioned = reg!(IntCounter::new(
            "watchbridge_repartitioned_inputs_total",
            "Inputs the repartition stage wrote to the repartition topic, keyed by their watch key (WATCHBRIDGE_REPARTITION); an input forwarded again after a crash counts again"
        ));
        let transactions = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_transactions_total",
                "Transactions of WATCHBRIDGE_GUARANTEE=exactly_once, by result: committed, aborted (the partition restarts from its last commit), fenced (another instance owns the partition now, or the broker aborted a transaction past its timeout)"
            ),
            &["result"]
        ));
        let partition_restarts_delayed = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_partition_restarts_delayed_total",
                "Partition restarts that waited, by reason: fenced (for the group to say whether the partition is still this instance's), failed_delivery (for the record to settle on a replicated cluster before the read-back), settling (assigned while records sent for it before may still commit), refused (the brokers refused it a write or a read: an ACL missing), aborted (its transactions aborted again and again)"
            ),
            &["reason"]
        ));
        let transaction_commit_duration = reg!(Histogram::with_opts(
            HistogramOpts::new(
                "watchbridge_transaction_commit_seconds",
                "Time from the start of a checkpoint to its transaction committed (outputs become visible to read_committed consumers then)"
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        ));
        let producer_queue_messages = reg!(IntGauge::new(
            "watchbridge_producer_queue_messages",
            "Records waiting in the producer's queue (librdkafka statistics)"
        ));
        let consumer_lag = reg!(IntGaugeVec::new(
            Opts::new(
                "watchbridge_consumer_lag_messages",
                "Input records not yet consumed, per assigned input partition (librdkafka statistics)"
            ),
            &["partition"]
        ));
        let ready = reg!(IntGauge::new(
            "watchbridge_ready",
            "1 while /readyz answers ready (assignment received, every assigned partition restored, not stopping), else 0"
        ));
        let guarantee_info = reg!(IntGaugeVec::new(
            Opts::new(
                "watchbridge_guarantee_info",
                "1, labelled with the guarantee this instance runs, WATCHBRIDGE_GUARANTEE's setting, and why auto fell back to recovery (empty when it did not)"
            ),
            &["guarantee", "setting", "fallback"]
        ));
        let brokers_reachable = reg!(IntGauge::new(
            "watchbridge_brokers_reachable",
            "1 while the brokers answer, 0 while the start waits for them and during an outage (every broker unreachable)"
        ));
        let broker_outages = reg!(IntCounter::new(
            "watchbridge_broker_outages_total",
            "Times every broker became unreachable while the bridge ran"
        ));
        let schema_registry_requests = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_schema_registry_requests_total",
                "Requests to the schema registry, by request (schema, reference, register) and result (ok, not_found, unavailable)"
            ),
            &["request", "result"]
        ));
        let schema_cache_size = reg!(IntGauge::new(
            "watchbridge_schema_cache_size",
            "Writer schemas held in the schema cache (fetched from the registry by id)"
        ));
        let outputs_dead_lettered = reg!(IntCounterVec::new(
            Opts::new(
                "watchbridge_outputs_dead_lettered_total",
                "Outputs sent to the dead-letter topic instead of the output topic, by reason (not_in_schema: the item does not fit WATCHBRIDGE_OUTPUT_SCHEMA)"
            ),
            &["reason"]
        ));
        let build_info = reg!(IntGaugeVec::new(
            Opts::new(
                "watchbridge_build_info",
                "1, labelled with the version of this build (and git_sha when it was built with GIT_SHA set)"
            ),
            &build_labels().iter().map(|(k, _)| *k).collect::<Vec<_>>()
        ));
        build_info
            .with_label_values(&build_labels().iter().map(|(_, v)| *v).collect::<Vec<_>>())
            .set(1);
        #[cfg(target_os = "linux")]
        {
            let collector = must("process", process::ProcessCollector::new());
            names.extend(collector.families());
            must("register", registry.register(Box::new(collector)));
        }
        Self {
            registry,
            watches_active,
            watches_started,
            watches_duplicate_inputs,
            watches_terminated,
            polls_ok: polls.with_label_values(&["ok", ""]),
            polls_error: polls,
            polls_deferred,
            retry_after_capped,
            poll_duration,
            poll_lateness,
            outputs_emitted,
            duplicates_suppressed,
            inputs_consumed,
            inputs_dead_lettered,
            outputs_produced,
            produce_failures,
            consumer_errors,
            partitions_assigned,
            partition_watermark,
            watermark,
            watermark_lag,
            late_outputs,
            outputs_past_retention,
            outputs_held_back,
            outputs_seen_silently,
            watches_restored,
            partitions_recovering,
            partitions_recovery_waiting,
            merged_watermark_writer,
            recovery_read_failures,
            recovery_duration,
            outputs_recovered,
            inputs_finished,
            inputs_skipped,
            control_actions,
            polling_paused,
            failed_watches_restarted,
            state_records_written,
            transactions,
            partition_restarts,
            partition_restarts_delayed,
            instance_stalls,
            inputs_keyed_apart,
            inputs_repartitioned,
            transaction_commit_duration,
            producer_queue_messages,
            consumer_lag,
            ready,
            guarantee_info,
            brokers_reachable,
            broker_outages,
            schema_registry_requests,
            schema_cache_size,
            outputs_dead_lettered,
            names,
        }
    }

    /// Every metric family this registers, with its type (a histogram `h` is scraped as
    /// `h_bucket`, `h_sum` and `h_count`).
    pub fn families(&self) -> &[(String, prometheus::proto::MetricType)] {
        &self.names
    }

    /// The text exposition format, as served on `/metrics`.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
    }
}

/// The labels of `watchbridge_build_info`: the crate's version, and the commit when the
/// build was given one (`GIT_SHA` at compile time, as deploy/Dockerfile does); no
/// build script runs git for it.
fn build_labels() -> Vec<(&'static str, &'static str)> {
    let mut labels = vec![("version", env!("CARGO_PKG_VERSION"))];
    if let Some(sha) = option_env!("GIT_SHA").filter(|s| !s.is_empty()) {
        labels.push(("git_sha", sha));
    }
    labels
}

/// The type a collector exposes.
fn metric_type<C: prometheus::core::Collector>(c: &C) -> prometheus::proto::MetricType {
    c.collect()
        .first()
        .map(|f| f.get_field_type())
        .unwrap_or(prometheus::proto::MetricType::UNTYPED)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_renders() {
        let m = Metrics::new();
        m.watches_started.inc();
        m.watches_terminated.with_label_values(&["final"]).inc();
        let text = m.render();
        assert!(text.contains("watchbridge_watches_started_total 1"));
        assert!(text.contains("watchbridge_watches_terminated_total{reason=\"final\"} 1"));
    }

    /// Base units and absent series: no watermark, no series (not a sentinel); once there
    /// is one, epoch seconds, and the lag in seconds.
    #[test]
    fn watermarks_are_absent_until_known_then_in_seconds() {
        use crate::internal_events::{MergedWatermarkChanged, PartitionWatermarkChanged};
        let m = Metrics::new();
        // A partition that went idle without ever having a watermark says so with the
        // beginning of time: still no series.
        PartitionWatermarkChanged {
            partition: 3,
            watermark: i64::MIN,
            idle: true,
        }
        .emit(&m);
        let text = m.render();
        for name in [
            "watchbridge_partition_watermark",
            "watchbridge_watermark_timestamp_seconds",
            "watchbridge_watermark_lag",
        ] {
            assert!(!text.contains(name), "{name} before any watermark:\n{text}");
        }
        PartitionWatermarkChanged {
            partition: 3,
            watermark: 1_700_000_000_250,
            idle: false,
        }
        .emit(&m);
        MergedWatermarkChanged {
            watermark: 1_700_000_000_250,
            now: 1_700_000_090_750,
        }
        .emit(&m);
        let text = m.render();
        for line in [
            "watchbridge_partition_watermark_timestamp_seconds{partition=\"3\"} 1700000000.25\n",
            "watchbridge_watermark_timestamp_seconds 1700000000.25\n",
            "watchbridge_watermark_lag_seconds 90.5\n",
        ] {
            assert!(text.contains(line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("_ms"), "a metric in milliseconds:\n{text}");
        // A partition that goes back to "none" (a new owner's generator) loses its series.
        PartitionWatermarkChanged {
            partition: 3,
            watermark: i64::MIN,
            idle: true,
        }
        .emit(&m);
        assert!(!m.render().contains("watchbridge_partition_watermark"));
    }

    /// The end of input (`END_OF_TIME`) is `+Inf`, not 292 million years from now.
    #[test]
    fn the_end_of_time_is_infinity() {
        use crate::internal_events::{MergedWatermarkChanged, PartitionWatermarkChanged};
        let m = Metrics::new();
        PartitionWatermarkChanged {
            partition: 0,
            watermark: i64::MAX,
            idle: true,
        }
        .emit(&m);
        MergedWatermarkChanged {
            watermark: i64::MAX,
            now: 1_700_000_000_000,
        }
        .emit(&m);
        let text = m.render();
        // The crate writes `inf`, which Prometheus reads as +Inf (Go's ParseFloat; `promtool
        // check metrics` accepts it).
        let value = |sample: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
        };
        assert_eq!(
            value("watchbridge_partition_watermark_timestamp_seconds{partition=\"0\"}"),
            f64::INFINITY
        );
        assert_eq!(
            value("watchbridge_watermark_timestamp_seconds"),
            f64::INFINITY
        );
        assert_eq!(value("watchbridge_watermark_lag_seconds"), 0.0);
    }

    #[test]
    fn build_info_says_the_version() {
        let text = Metrics::new().render();
        let line = text
            .lines()
            .find(|l| l.starts_with("watchbridge_build_info{"))
            .unwrap_or_else(|| panic!("no watchbridge_build_info in\n{text}"));
        assert!(
            line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(line.ends_with("} 1"), "{line}");
    }

    #[test]
    fn families_lists_every_registered_name_with_its_type() {
        let m = Metrics::new();
        let find = |name: &str| {
            m.families()
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| *t)
        };
        assert_eq!(
            find("watchbridge_consumer_lag_messages"),
            Some(prometheus::proto::MetricType::GAUGE),
            "a labelled family with no child yet is listed too"
        );
        assert_eq!(
            find("watchbridge_poll_duration_seconds"),
            Some(prometheus::proto::MetricType::HISTOGRAM)
        );
        assert_eq!(
            find("watchbridge_outputs_produced_total"),
            Some(prometheus::proto::MetricType::COUNTER)
        );
        assert_eq!(
            find("watchbridge_watermark_timestamp_seconds"),
            Some(prometheus::proto::MetricType::GAUGE),
            "an optional gauge is listed before it has a value"
        );
        #[cfg(target_os = "linux")]
        assert_eq!(
            find("process_cpu_seconds_total"),
            Some(prometheus::proto::MetricType::COUNTER)
        );
        assert!(m
            .families()
            .iter()
            .all(|(n, _)| n.starts_with("watchbridge_") || n.starts_with("process_")));
    }

    /// The process collector's families are scraped with the rest.
    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_are_rendered() {
        let text = Metrics::new().render();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "no {name}in\n{text}"
            );
        }
    }
}

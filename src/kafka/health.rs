//! Whether the brokers can be reached, as one state for the whole bridge, however many
//! librdkafka clients it runs (the group consumer, the shared producer, a transactional
//! producer per partition in the exactly-once mode, the recovery readers, the watermark
//! reader) and however often each of them reports a lost connection.
//!
//! Every client the bridge creates has a context that routes librdkafka's errors and log
//! lines here ([`KafkaContext`], or a context of its own that delegates to one):
//!
//! - `AllBrokersDown` makes the state *suspect*; [`BrokerHealth::watch`] then asks for
//!   metadata with a fresh client, and only if that fails too is the outage reported, once:
//!   [`BrokersUnreachable`] (a warning, `watchbridge_broker_outages_total`,
//!   `watchbridge_brokers_reachable` 0). It keeps asking, with backoff, and reports the end
//!   once: [`BrokersReachable`]. (librdkafka also reports `AllBrokersDown` when nothing is
//!   wrong, e.g. as a client is destroyed: that one is not an outage.)
//! - Connection errors and connection log lines (`FAIL`, `REQTMOUT`, ...; transport
//!   failures, timeouts) are logged at debug while the brokers are known to be unreachable
//!   (during an outage, or while the start waits for them), and otherwise at most once a
//!   minute per kind, saying how many were left out: one broker of several going away
//!   still shows, without a line per client per reconnect attempt.
//! - `PartitionEOF` (reported by readers that ask for it) is no error: trace.
//! - Anything else is logged as librdkafka reports it (target `librdkafka`).

use crate::internal_events::{BrokersReachable, BrokersUnreachable};
use crate::metrics::Metrics;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often one kind of connection trouble is logged while the brokers are reachable.
const CONNECTION_LOG_EVERY: Duration = Duration::from_secs(60);
/// How long a metadata request that checks the brokers may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Backoff between checks during an outage.
const PROBE_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(5));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The start has not reached the brokers yet.
    Starting,
    Up,
    Down {
        since: Instant,
    },
}

struct State {
    phase: Phase,
    /// librdkafka reported every broker down (its reason), not yet checked.
    suspected: Option<String>,
    /// Per kind of connection trouble: when it was last logged, and how many since.
    logged: HashMap<String, (Instant, u64)>,
    /// The last login the brokers refused (TLS handshake, SASL), librdkafka's reason.
    login_refused: Option<String>,
}

/// The brokers' reachability, shared by every client of one bridge.
pub struct BrokerHealth {
    brokers: String,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    suspect: Notify,
}

impl BrokerHealth {
    /// Not reached yet (`watchbridge_brokers_reachable` stays 0 until [`Self::reached`]).
    pub fn new(brokers: &str, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            brokers: brokers.to_string(),
            metrics,
            state: Mutex::new(State {
                phase: Phase::Starting,
                suspected: None,
                logged: HashMap::new(),
                login_refused: None,
            }),
            suspect: Notify::new(),
        })
    }

    /// The bootstrap servers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The start reached the brokers: from now on an outage is watched for.
    pub fn reached(&self) {
        let mut state = self.state();
        if state.phase == Phase::Starting {
            state.phase = Phase::Up;
        }
    }

    /// The last login the brokers refused, if any (`kafka::refusal`): the start fails on it
    /// rather than waiting for brokers that answer.
    pub fn login_refused(&self) -> Option<String> {
        self.state().login_refused.clone()
    }

    /// Whether the brokers are known to be unreachable (an outage, or a start still
    /// waiting for them).
    pub fn is_unreachable(&self) -> bool {
        !matches!(self.state().phase, Phase::Up)
    }

    /// librdkafka reported every broker down: check, and report an outage if so.
    fn all_down(&self, reason: &str) {
        let mut state = self.state();
        if state.phase == Phase::Up {
            state.suspected = Some(reason.to_string());
            drop(state);
            self.suspect.notify_one();
        }
    }

    /// Watch for outages until dropped: each `AllBrokersDown` report is checked with
    /// `probe` (a metadata request with a fresh client, given its timeout); a confirmed
    /// outage is reported once, then checked with backoff until `probe` succeeds, and its
    /// end reported once.
    pub async fn watch<F>(self: Arc<Self>, probe: F)
    where
        F: Fn(Duration) -> Result<(), String> + Clone + Send + Sync + 'static,
    {
        let check = |probe: F| async move {
            tokio::task::spawn_blocking(move || probe(PROBE_TIMEOUT))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        };
        loop {
            self.suspect.notified().await;
            let Some(reason) = self.state().suspected.take() else {
                continue;
            };
            if check(probe.clone()).await.is_ok() {
                tracing::debug!(
                    reason,
                    "librdkafka reported every broker down, but they answer"
                );
                continue;
            }
            let since = Instant::now();
            self.state().phase = Phase::Down { since };
            BrokersUnreachable {
                brokers: &self.brokers,
                error: &reason,
            }
            .emit(&self.metrics);
            let mut backoff = PROBE_BACKOFF.0;
            loop {
                tokio::time::sleep(backoff).await;
                if check(probe.clone()).await.is_ok() {
                    break;
                }
                backoff = (backoff * 2).min(PROBE_BACKOFF.1);
            }
            {
                let mut state = self.state();
                state.phase = Phase::Up;
                state.suspected = None;
                state.logged.clear();
            }
            BrokersReachable {
                brokers: &self.brokers,
                down_for: since.elapsed(),
            }
            .emit(&self.metrics);
        }
    }

    /// Whether a line about connection trouble of kind `key` is worth logging at its own
    /// level now (`Some(how many were left out since the last one)`), or only at debug.
    fn connection_line(&self, key: &str) -> Option<u64> {
        let mut state = self.state();
        if state.phase != Phase::Up {
            return None;
        }
        let now = Instant::now();
        match state.logged.get_mut(key) {
            Some((last, left_out)) if now.duration_since(*last) < CONNECTION_LOG_EVERY => {
                *left_out += 1;
                None
            }
            Some((last, left_out)) => {
                let n = *left_out;
                (*last, *left_out) = (now, 0);
                Some(n)
            }
            None => {
                state.logged.insert(key.to_string(), (now, 0));
                Some(0)
            }
        }
    }

    /// librdkafka's log callback, for every client of the bridge.
    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if fac == "FAIL"
            && message.contains("SaslAuthenticateRequest failed: Local: Broker transport failure")
        {
            // librdkafka's group coordinator handle closing its connection while it logs
            // in (every secured start, once): no refusal and no outage.
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}");
            return;
        }
        if fac == "FAIL" && is_login_refused(message) {
            // The error callback may never say so: a client that failed its login is
            // often dropped before librdkafka hands it the error (the start's admin).
            self.state().login_refused = Some(message.to_string());
        }
        if is_connection_facility(fac) {
            match self.connection_line(fac) {
                Some(left_out) => log_at(level, fac, message, left_out),
                None => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
            }
            return;
        }
        log_at(level, fac, message, 0);
    }

    /// librdkafka's error callback, for every client of the bridge.
    pub fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                tracing::debug!(target: "librdkafka", error = %error, reason, "librdkafka: every broker down");
                self.all_down(reason);
            }
            Some(code) if super::refusal::is_authentication(code) => {
                tracing::error!(target: "librdkafka", error = %error, reason, "the brokers refused the login");
                self.state().login_refused = Some(reason.to_string());
            }
            Some(RDKafkaErrorCode::PartitionEOF) => {
                tracing::trace!(target: "librdkafka", reason, "librdkafka: end of partition");
            }
            Some(code) if is_connection_error(code) => {
                match self.connection_line(&format!("{code:?}")) {
                    Some(left_out) => tracing::warn!(
                        target: "librdkafka",
                        error = %error,
                        reason,
                        left_out,
                        "librdkafka: connection error (one a minute is logged; left_out: since the last one)"
                    ),
                    None => {
                        tracing::debug!(target: "librdkafka", error = %error, reason, "librdkafka: connection error")
                    }
                }
            }
            _ => tracing::error!(target: "librdkafka", error = %error, reason, "librdkafka error"),
        }
    }
}

/// A connection's failure that is the brokers refusing the login (librdkafka's `FAIL` line):
/// SASL's answer, or a TLS handshake the broker (or our check of its certificate) refused.
fn is_login_refused(message: &str) -> bool {
    // Not a connection that dropped while it logged in ("SaslAuthenticateRequest failed:
    // Local: Broker transport failure", librdkafka's line when it closes the group
    // coordinator's connection mid-login): that is no answer.
    let dropped = message.contains("Local: Broker transport failure");
    !dropped
        && (message.contains("SASL authentication error")
            || message.contains("SSL handshake failed")
            || message.contains("SASL handshake failed"))
}

/// librdkafka's log facilities about one connection failing or timing out.
fn is_connection_facility(fac: &str) -> bool {
    matches!(
        fac,
        "FAIL" | "REQTMOUT" | "CONNECT" | "BROKERFAIL" | "RECV" | "SEND" | "SSL" | "TIMEOUT"
    )
}

/// Error codes that say a connection failed, not that a request was refused.
pub fn is_connection_error(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::NetworkException
    )
}

fn log_at(level: RDKafkaLogLevel, fac: &str, message: &str, left_out: u64) {
    macro_rules! line {
        ($mac:ident) => {
            if left_out > 0 {
                tracing::$mac!(target: "librdkafka", left_out, "librdkafka: {fac} {message}")
            } else {
                tracing::$mac!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
        };
    }
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => line!(error),
        RDKafkaLogLevel::Warning => line!(warn),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => line!(info),
        RDKafkaLogLevel::Debug => line!(debug),
    }
}

/// The context of a bridge's Kafka client that needs no callbacks of its own: its errors
/// and log lines go to the bridge's [`BrokerHealth`].
#[derive(Clone)]
pub struct KafkaContext {
    pub health: Arc<BrokerHealth>,
}

impl KafkaContext {
    pub fn new(health: Arc<BrokerHealth>) -> Self {
        Self { health }
    }
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.health.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.health.error(error, reason);
    }
}

impl ConsumerContext for KafkaContext {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused login is told from a connection dropped during one (issue 47).
    #[test]
    fn a_refused_login_is_told_from_a_dropped_connection() {
        assert!(is_login_refused(
            "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication \
             failed during authentication due to invalid credentials with SASL mechanism \
             SCRAM-SHA-512 (after 3ms in state AUTH_REQ)"
        ));
        assert!(is_login_refused(
            "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: certificate verify failed"
        ));
        assert!(!is_login_refused(
            "GroupCoordinator: SASL authentication error: SaslAuthenticateRequest failed: \
             Local: Broker transport failure (after 0ms in state DOWN)"
        ));
    }

    #[test]
    fn connection_trouble_is_logged_once_a_minute_while_up_and_never_while_down() {
        let health = BrokerHealth::new("b:9092", Arc::new(Metrics::new()));
        assert_eq!(health.connection_line("FAIL"), None, "starting: quiet");
        health.reached();
        assert_eq!(health.connection_line("FAIL"), Some(0));
        assert_eq!(health.connection_line("FAIL"), None);
        assert_eq!(health.connection_line("FAIL"), None);
        assert_eq!(health.connection_line("REQTMOUT"), Some(0), "another kind");
        health.state().phase = Phase::Down {
            since: Instant::now(),
        };
        assert_eq!(health.connection_line("CONNECT"), None, "down: quiet");
        assert!(health.is_unreachable());
    }

    #[tokio::test]
    async fn an_outage_is_reported_once_when_confirmed_and_once_when_it_ends() {
        let metrics = Arc::new(Metrics::new());
        let health = BrokerHealth::new("b:9092", metrics.clone());
        health.reached();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let probe = {
            let up = up.clone();
            move |_: Duration| {
                if up.load(std::sync::atomic::Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("refused".to_string())
                }
            }
        };
        let watcher = tokio::spawn(health.clone().watch(probe));
        // Reported while the brokers answer: not an outage.
        health.all_down("1/1 brokers are down");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(metrics.broker_outages.get(), 0);
        assert!(!health.is_unreachable());
        // A real one, reported by many clients.
        up.store(false, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..10 {
            health.all_down("2/2 brokers are down");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !health.is_unreachable() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..10 {
            health.all_down("2/2 brokers are down");
        }
        assert_eq!(metrics.broker_outages.get(), 1);
        assert_eq!(metrics.brokers_reachable.get(), 0);
        up.store(true, std::sync::atomic::Ordering::SeqCst);
        while health.is_unreachable() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(metrics.brokers_reachable.get(), 1);
        assert_eq!(metrics.broker_outages.get(), 1);
        watcher.abort();
    }
}

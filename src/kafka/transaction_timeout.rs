//! How long a transaction of the exactly-once mode may stay open, fitted to the checkpoint
//! interval at start.
//!
//! A partition's transaction opens with its first record after a checkpoint and commits at
//! the next one, once every record in it is acknowledged: it lives up to
//! `WATCHBRIDGE_CHECKPOINT_INTERVAL`, plus the time its last records take to be
//! acknowledged (bounded by librdkafka's `message.timeout.ms`: a record not acknowledged by
//! then fails, and the transaction is aborted by the bridge), plus the commit itself. A
//! transaction that outlives `transaction.timeout.ms` is aborted by the coordinator, which
//! bumps the producer's epoch: the producer's next request fails with a fatal "fenced"
//! error, and everything since the last commit is lost to the partition's task. So the
//! three must fit:
//!
//! `transaction.timeout.ms >= checkpoint interval + message.timeout.ms + COMMIT_MARGIN`
//!
//! and `transaction.timeout.ms` must not exceed the brokers' `transaction.max.timeout.ms`
//! (15 minutes by default), or `init_transactions` is refused. What the user did not set is
//! chosen to fit; what they set and cannot fit fails the start, naming the settings.

use std::time::Duration;

/// Time left in a transaction for `send_offsets_to_transaction` and the commit, after its
/// last record was acknowledged or failed.
pub const COMMIT_MARGIN: Duration = Duration::from_secs(10);

/// librdkafka's default `transaction.timeout.ms`, kept where it fits.
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// `message.timeout.ms` chosen when neither it nor `transaction.timeout.ms` is set and the
/// checkpoint interval leaves less than this under the default transaction timeout.
const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The transactional producer's two timeouts, as librdkafka properties take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionTimeouts {
    /// `transaction.timeout.ms`.
    pub transaction: Duration,
    /// `message.timeout.ms`.
    pub message: Duration,
}

impl TransactionTimeouts {
    /// Fit the timeouts to `checkpoint_interval`, given what the user set
    /// (`KAFKA_TRANSACTION_TIMEOUT_MS`, `KAFKA_MESSAGE_TIMEOUT_MS`) and the brokers' maximum
    /// where it is known. An error says which settings cannot fit and what would.
    pub fn fit(
        checkpoint_interval: Duration,
        transaction: Option<Duration>,
        message: Option<Duration>,
        broker_max: Option<Duration>,
    ) -> Result<TransactionTimeouts, String> {
        let ms = |d: Duration| d.as_millis();
        let fitted = match (transaction, message) {
            (Some(transaction), Some(message)) => TransactionTimeouts {
                transaction,
                message,
            },
            (Some(transaction), None) => {
                let left = transaction
                    .checked_sub(checkpoint_interval + COMMIT_MARGIN)
                    .filter(|left| *left >= Duration::from_secs(1))
                    .ok_or_else(|| {
                        format!(
                            "KAFKA_TRANSACTION_TIMEOUT_MS={} leaves no time to deliver a \
                             checkpoint's records: a transaction lives up to \
                             WATCHBRIDGE_CHECKPOINT_INTERVAL ({}) plus the records' delivery \
                             (message.timeout.ms) plus {} s to commit; set it to at least {} \
                             or shorten WATCHBRIDGE_CHECKPOINT_INTERVAL",
                            ms(transaction),
                            humantime::format_duration(checkpoint_interval),
                            COMMIT_MARGIN.as_secs(),
                            ms(checkpoint_interval + COMMIT_MARGIN + Duration::from_secs(5)),
                        )
                    })?;
                TransactionTimeouts {
                    transaction,
                    message: left,
                }
            }
            (None, message) => {
                let message = message.unwrap_or_else(|| {
                    DEFAULT_TRANSACTION_TIMEOUT
                        .checked_sub(checkpoint_interval + COMMIT_MARGIN)
                        .filter(|left| *left >= DEFAULT_MESSAGE_TIMEOUT)
                        .unwrap_or(DEFAULT_MESSAGE_TIMEOUT)
                });
                TransactionTimeouts {
                    transaction: DEFAULT_TRANSACTION_TIMEOUT
                        .max(checkpoint_interval + message + COMMIT_MARGIN),
                    message,
                }
            }
        };
        let needed = checkpoint_interval + fitted.message + COMMIT_MARGIN;
        if fitted.transaction < needed {
            return Err(format!(
                "KAFKA_TRANSACTION_TIMEOUT_MS={} is shorter than a transaction can live: \
                 WATCHBRIDGE_CHECKPOINT_INTERVAL ({}) + KAFKA_MESSAGE_TIMEOUT_MS ({}) + {} s to \
                 commit = {} ms; the coordinator would abort it, and the partition's producer \
                 would be fenced. Raise KAFKA_TRANSACTION_TIMEOUT_MS, or lower the others",
                ms(fitted.transaction),
                humantime::format_duration(checkpoint_interval),
                ms(fitted.message),
                COMMIT_MARGIN.as_secs(),
                ms(needed),
            ));
        }
        if let Some(max) = broker_max.filter(|max| fitted.transaction > *max) {
            let whose = if transaction.is_some() {
                "KAFKA_TRANSACTION_TIMEOUT_MS"
            } else {
                "the transaction timeout that WATCHBRIDGE_CHECKPOINT_INTERVAL needs"
            };
            return Err(format!(
                "{whose} ({} ms) is above the brokers' transaction.max.timeout.ms ({} ms), so \
                 the brokers would refuse every partition's transactional producer; shorten \
                 WATCHBRIDGE_CHECKPOINT_INTERVAL (now {}) or KAFKA_MESSAGE_TIMEOUT_MS, or raise \
                 the brokers' transaction.max.timeout.ms",
                ms(fitted.transaction),
                ms(max),
                humantime::format_duration(checkpoint_interval),
            ));
        }
        Ok(fitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_defaults_fit_a_short_checkpoint_interval_in_librdkafkas_minute() {
        let fitted = TransactionTimeouts::fit(Duration::from_millis(500), None, None, None);
        assert_eq!(
            fitted,
            Ok(TransactionTimeouts {
                transaction: s(60),
                message: Duration::from_millis(49_500),
            })
        );
    }

    #[test]
    fn a_long_checkpoint_interval_gets_a_longer_transaction_timeout() {
        // The case: 90 s checkpoints under librdkafka's 60 s transaction timeout
        // were aborted by the coordinator every time.
        let fitted = TransactionTimeouts::fit(s(90), None, None, Some(s(900))).unwrap();
        assert_eq!(fitted.message, s(30));
        assert_eq!(fitted.transaction, s(130));
    }

    #[test]
    fn a_transaction_timeout_set_too_short_for_the_interval_is_refused() {
        let error = TransactionTimeouts::fit(s(15), Some(s(10)), None, None).unwrap_err();
        assert!(
            error.contains("KAFKA_TRANSACTION_TIMEOUT_MS=10000"),
            "{error}"
        );
        assert!(error.contains("WATCHBRIDGE_CHECKPOINT_INTERVAL"), "{error}");
    }

    #[test]
    fn a_set_transaction_timeout_bounds_the_message_timeout() {
        // Kafka Streams' 10 s with a 500 ms interval: records get what is left.
        let fitted =
            TransactionTimeouts::fit(Duration::from_millis(500), Some(s(20)), None, None).unwrap();
        assert_eq!(fitted.message, Duration::from_millis(9_500));
    }

    #[test]
    fn both_set_and_not_fitting_is_refused() {
        let error = TransactionTimeouts::fit(s(1), Some(s(20)), Some(s(15)), None).unwrap_err();
        assert!(
            error.contains("KAFKA_MESSAGE_TIMEOUT_MS (15000)"),
            "{error}"
        );
        assert!(TransactionTimeouts::fit(s(1), Some(s(30)), Some(s(15)), None).is_ok());
    }

    #[test]
    fn above_the_brokers_maximum_is_refused() {
        let error = TransactionTimeouts::fit(s(600), None, None, Some(s(300))).unwrap_err();
        assert!(
            error.contains("transaction.max.timeout.ms (300000 ms)"),
            "{error}"
        );
        assert!(error.contains("WATCHBRIDGE_CHECKPOINT_INTERVAL"), "{error}");
    }
}

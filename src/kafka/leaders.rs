//! A partition whose leader is being elected: what a start on topics it created a moment
//! ago meets on Apache Kafka, where the metadata may name a leader that does not know yet
//! that it leads. Asked again, it answers; anything else (a timeout, a refusal) is not
//! this, and is no reason to wait.

use rdkafka::types::RDKafkaErrorCode;

/// The codes of a leader election under way (or of a topic not yet known to the broker
/// asked), which a read asks again rather than fails on.
pub fn electing(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::NotLeaderForPartition
            | C::LeaderNotAvailable
            | C::UnknownTopicOrPartition
            | C::UnknownLeaderEpoch
            | C::FencedLeaderEpoch
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeout used the read's time already: waiting on would only delay the start.
    #[test]
    fn an_election_is_waited_for_and_a_timeout_is_not() {
        assert!(electing(RDKafkaErrorCode::NotLeaderForPartition));
        assert!(electing(RDKafkaErrorCode::LeaderNotAvailable));
        assert!(!electing(RDKafkaErrorCode::RequestTimedOut));
        assert!(!electing(RDKafkaErrorCode::OperationTimedOut));
        assert!(!electing(RDKafkaErrorCode::TopicAuthorizationFailed));
    }
}

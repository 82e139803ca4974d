//! Refusals by the cluster: a login that failed (authentication) or a principal that may not
//! do something (authorization, an ACL missing). Neither passes by waiting a moment as a
//! leader election does, and neither says anything about the data: a refused write is not a
//! bad output (it is never dead-lettered nor given up: its watch still owes it), a refused read is not
//! an empty topic. Where the bridge meets one, it says which resource and operation, and
//! what to grant (docs/brokers.md, "Least privilege").

use rdkafka::error::RDKafkaErrorCode;

/// An ACL is missing: the principal logged in but may not do this.
pub fn is_authorization(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::DelegationTokenAuthorizationFailed
    )
}

/// The login failed: wrong credentials, a mechanism the listener does not offer, a TLS
/// handshake refused.
pub fn is_authentication(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Authentication | C::SaslAuthenticationFailed | C::SSL | C::UnsupportedSASLMechanism
    )
}

/// Either kind of refusal.
pub fn is_refusal(code: RDKafkaErrorCode) -> bool {
    is_authorization(code) || is_authentication(code)
}

/// What an operator grants for a refusal of `code` on `resource` (e.g. `topic out`): one
/// sentence naming the ACL, for errors and logs.
pub fn what_to_grant(code: RDKafkaErrorCode, operation: &str, resource: &str) -> String {
    if is_authentication(code) {
        return format!(
            "the brokers refused the login ({code}): check KAFKA_SECURITY_PROTOCOL, \
             KAFKA_SASL_MECHANISM and the credentials (KAFKA_SASL_USERNAME/PASSWORD, the \
             certificates)"
        );
    }
    format!(
        "the brokers' authorizer refused {operation} on {resource} ({code}): grant the \
         principal an ACL allowing {operation} on {resource} (docs/brokers.md, \"Least \
         privilege\")"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_and_authentication_are_refusals_and_a_leader_election_is_not() {
        assert!(is_authorization(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        ));
        assert!(is_authentication(
            RDKafkaErrorCode::SaslAuthenticationFailed
        ));
        assert!(is_refusal(RDKafkaErrorCode::TopicAuthorizationFailed));
        assert!(!is_refusal(RDKafkaErrorCode::NotLeaderForPartition));
        let said = what_to_grant(
            RDKafkaErrorCode::TopicAuthorizationFailed,
            "WRITE",
            "topic `out`",
        );
        assert!(
            said.contains("WRITE") && said.contains("topic `out`"),
            "{said}"
        );
    }
}

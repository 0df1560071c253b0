//! librdkafka's errors as [`SourceError`]s, so the processor host tells a missing topic, a
//! refused login and a network failure apart as it does over Event Hubs.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tributary_source::SourceError;

/// The source error a librdkafka error means; `what` names the operation, for the message.
pub(crate) fn source_error(what: &str, error: &KafkaError) -> SourceError {
    let description = format!("{what}: {error}");
    let Some(code) = error.rdkafka_error_code() else {
        return SourceError::Other { description };
    };
    match code {
        RDKafkaErrorCode::UnknownTopicOrPartition
        | RDKafkaErrorCode::UnknownTopic
        | RDKafkaErrorCode::UnknownPartition => SourceError::NotFound { what: description },
        RDKafkaErrorCode::Authentication
        | RDKafkaErrorCode::SaslAuthenticationFailed
        | RDKafkaErrorCode::TopicAuthorizationFailed
        | RDKafkaErrorCode::GroupAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed => SourceError::Unauthorized { description },
        RDKafkaErrorCode::BrokerTransportFailure
        | RDKafkaErrorCode::Resolve
        | RDKafkaErrorCode::AllBrokersDown
        | RDKafkaErrorCode::OperationTimedOut
        | RDKafkaErrorCode::RequestTimedOut
        | RDKafkaErrorCode::NetworkException
        | RDKafkaErrorCode::LeaderNotAvailable
        | RDKafkaErrorCode::NotLeaderForPartition => SourceError::Transient { description },
        _ => SourceError::Other { description },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_as_the_host_needs() {
        let error = |code| KafkaError::MetadataFetch(code);
        assert!(matches!(
            source_error("x", &error(RDKafkaErrorCode::UnknownTopicOrPartition)),
            SourceError::NotFound { .. }
        ));
        assert!(matches!(
            source_error("x", &error(RDKafkaErrorCode::SaslAuthenticationFailed)),
            SourceError::Unauthorized { .. }
        ));
        assert!(source_error("x", &error(RDKafkaErrorCode::AllBrokersDown)).is_transient());
        let other = source_error("reading", &KafkaError::Canceled);
        assert!(matches!(other, SourceError::Other { .. }));
        assert!(other.to_string().starts_with("reading: "), "{other}");
    }
}

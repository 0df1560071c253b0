//! The door's own errors, and the Kafka error code each broker error becomes.

use std::net::SocketAddr;

use kafka_protocol::ResponseError;
use tributary_broker::{BrokerError, LogError};

/// Why the Kafka door could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The listener could not be bound.
    #[error("cannot listen for Kafka clients on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
}

/// The code a Kafka client gets for a broker error. Storage failures and a shutting-down
/// broker get codes clients retry (KAFKA_STORAGE_ERROR, NOT_LEADER_OR_FOLLOWER): nothing
/// failed is acknowledged, and the client sends it again.
pub fn code(error: &BrokerError) -> i16 {
    let code = match error {
        BrokerError::HubNotFound { .. } | BrokerError::InvalidPartition { .. } => {
            ResponseError::UnknownTopicOrPartition
        }
        BrokerError::InvalidName(_) => ResponseError::InvalidTopicException,
        BrokerError::InvalidSend(_) => ResponseError::InvalidRecord,
        BrokerError::ShuttingDown => ResponseError::NotLeaderOrFollower,
        BrokerError::Log { source, .. } => match source {
            LogError::EventTooLarge { .. } | LogError::BatchTooLarge { .. } => {
                ResponseError::MessageTooLarge
            }
            LogError::SequenceNumberOutOfRange { .. }
            | LogError::OffsetOutOfRange { .. }
            | LogError::Expired { .. } => ResponseError::OffsetOutOfRange,
            // Kafka itself refuses a keyless record on a compacted topic with INVALID_RECORD.
            LogError::InvalidEvent { .. }
            | LogError::EmptyBatch
            | LogError::MissingPartitionKey { .. } => ResponseError::InvalidRecord,
            _ => ResponseError::KafkaStorageError,
        },
        _ => ResponseError::KafkaStorageError,
    };
    code.code()
}

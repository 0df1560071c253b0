//! How broker errors map to the error conditions the Event Hubs service sends.
//!
//! The conditions themselves, and [`Refusal`], are the dialect's (`tributary_eventhubs::condition`,
//! re-exported here); this module only decides which one a broker error becomes, and in the
//! service's words (see the research notes, §7).

use tributary_broker::{BrokerError, DisconnectReason};
pub use tributary_eventhubs::condition::*;

fn nil(name: Option<&str>) -> &str {
    name.unwrap_or("nil")
}

/// Maps a broker error to the condition the service would send. `receiver_name` is the name
/// the client gave its receiver (`com.microsoft:receiver-name`), for the service's wording.
pub fn from_broker(error: &BrokerError, receiver_name: Option<&str>) -> Refusal {
    use tributary_broker::LogError;
    let text = error.to_string();
    match error {
        BrokerError::HubNotFound { .. } | BrokerError::ConsumerGroupNotFound { .. } => {
            Refusal::new(NOT_FOUND, text)
        }
        BrokerError::InvalidPartition { .. } | BrokerError::InvalidName(_) => {
            Refusal::new(ARGUMENT_OUT_OF_RANGE, text)
        }
        BrokerError::EpochTooLow {
            current, requested, ..
        } => Refusal::new(
            LINK_STOLEN,
            format!(
                "Receiver '{name}' with a higher epoch '{current}' already exists. Receiver '{name}' with epoch {requested} cannot be created. Make sure you are creating receiver with increasing epoch value to ensure connectivity, or ensure all old epoch receivers are closed or disconnected.",
                name = nil(receiver_name)
            ),
        ),
        BrokerError::EpochReceiverActive { current, .. } => Refusal::new(
            LINK_STOLEN,
            format!(
                "At least one receiver for the endpoint is created with epoch of '{current}', and so non-epoch receiver is not allowed. Either reconnect with a higher epoch, or make sure all epoch receivers are closed or disconnected."
            ),
        ),
        BrokerError::TooManyReceivers { max, names, .. } => Refusal::new(
            RESOURCE_LIMIT,
            format!(
                "Exceeded the maximum number of allowed receivers per partition in a consumer group which is {max}. List of connected receivers - {names}."
            ),
        ),
        BrokerError::InvalidSend(_) | BrokerError::InvalidProcessorRecord(_) => {
            Refusal::new(ARGUMENT_ERROR, text)
        }
        BrokerError::OwnershipLost { .. } => Refusal::new(PRECONDITION_FAILED, text),
        BrokerError::ShuttingDown => Refusal::new(DETACH_FORCED, text),
        BrokerError::Log { source, .. } => match source {
            LogError::EventTooLarge { .. } | LogError::BatchTooLarge { .. } => {
                Refusal::new(MESSAGE_SIZE_EXCEEDED, text)
            }
            LogError::SequenceNumberOutOfRange { .. }
            | LogError::OffsetOutOfRange { .. }
            | LogError::Expired { .. } => Refusal::new(ARGUMENT_OUT_OF_RANGE, text),
            LogError::InvalidEvent { .. }
            | LogError::EmptyBatch
            | LogError::MissingPartitionKey { .. } => Refusal::new(ARGUMENT_ERROR, text),
            _ => Refusal::new(INTERNAL_ERROR, text),
        },
        _ => Refusal::new(INTERNAL_ERROR, text),
    }
}

/// Maps the reason the broker disconnected a receiver to the detach the client gets.
pub fn from_disconnect(
    reason: &DisconnectReason,
    receiver_name: Option<&str>,
    epoch: Option<i64>,
) -> Refusal {
    match reason {
        DisconnectReason::Stolen { new_epoch } => Refusal::new(
            LINK_STOLEN,
            format!(
                "New receiver 'nil' with higher epoch of '{new_epoch}' is created hence current receiver '{name}' with epoch '{epoch}' is getting disconnected. If you are recreating the receiver, make sure a higher epoch is used.",
                name = nil(receiver_name),
                epoch = epoch.map_or_else(|| "nil".to_owned(), |e| e.to_string()),
            ),
        ),
        DisconnectReason::ConsumerGroupDeleted | DisconnectReason::HubDeleted => {
            Refusal::new(NOT_FOUND, reason.to_string())
        }
        DisconnectReason::Shutdown => Refusal::new(DETACH_FORCED, reason.to_string()),
        _ => Refusal::new(DETACH_FORCED, reason.to_string()),
    }
}

//! What the broker reports, in terms a client of any protocol can be told.
//!
//! Every error names the entity it is about. Front doors map these to their protocol's error
//! conditions (for AMQP: `amqp:not-found`, `amqp:link:stolen`, `amqp:resource-limit-exceeded`,
//! `com.microsoft:argument-out-of-range`, …) without parsing messages.

use tributary_event::names::{InvalidName, InvalidPartitionId};
use tributary_log::LogError;

/// An error from a broker operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// A name breaks the naming rules.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// A partition id that the hub does not have.
    #[error("event hub {hub:?}: {source}")]
    InvalidPartition {
        /// The hub.
        hub: String,
        /// The detail.
        #[source]
        source: InvalidPartitionId,
    },
    /// No event hub by that name.
    #[error("event hub {name:?} does not exist")]
    HubNotFound {
        /// The name asked for.
        name: String,
    },
    /// An event hub by that name (in any case) exists already.
    #[error("event hub {name:?} already exists")]
    HubExists {
        /// The name asked for.
        name: String,
    },
    /// A partition count outside 1 to 1024.
    #[error("an event hub has 1 to {max} partitions, not {count}")]
    InvalidPartitionCount {
        /// The count asked for.
        count: u32,
        /// The limit.
        max: u32,
    },
    /// A retention setting out of range.
    #[error("invalid retention: {0}")]
    InvalidRetention(String),
    /// No consumer group by that name in that hub.
    #[error("consumer group {group:?} does not exist in event hub {hub:?}")]
    ConsumerGroupNotFound {
        /// The hub.
        hub: String,
        /// The group asked for.
        group: String,
    },
    /// A consumer group by that name (in any case) exists already.
    #[error("consumer group {group:?} already exists in event hub {hub:?}")]
    ConsumerGroupExists {
        /// The hub.
        hub: String,
        /// The group.
        group: String,
    },
    /// The hub has as many consumer groups as it may.
    #[error("event hub {hub:?} already has the maximum of {max} consumer groups")]
    ConsumerGroupLimit {
        /// The hub.
        hub: String,
        /// The limit.
        max: u32,
    },
    /// `$Default` cannot be deleted.
    #[error("the $Default consumer group cannot be deleted")]
    DefaultConsumerGroup,
    /// A send names both a partition and a partition key, or events disagree with the key.
    #[error("invalid send: {0}")]
    InvalidSend(String),
    /// A receiver asked for an epoch lower than the open epoch receiver's.
    #[error(
        "receiver with epoch {requested} cannot be created: a receiver with the higher epoch {current} already exists on partition {partition} of {hub}/{group}"
    )]
    EpochTooLow {
        /// The hub.
        hub: String,
        /// The consumer group.
        group: String,
        /// The partition.
        partition: u32,
        /// The open receiver's epoch.
        current: i64,
        /// The epoch asked for.
        requested: i64,
    },
    /// A non-epoch receiver was refused because an epoch receiver is open.
    #[error(
        "a receiver with epoch {current} is open on partition {partition} of {hub}/{group}, so a non-epoch receiver is not allowed"
    )]
    EpochReceiverActive {
        /// The hub.
        hub: String,
        /// The consumer group.
        group: String,
        /// The partition.
        partition: u32,
        /// The open receiver's epoch.
        current: i64,
    },
    /// The sixth non-epoch receiver was refused.
    #[error(
        "exceeded the maximum of {max} receivers on partition {partition} of {hub}/{group}; connected receivers: {names}"
    )]
    TooManyReceivers {
        /// The hub.
        hub: String,
        /// The consumer group.
        group: String,
        /// The partition.
        partition: u32,
        /// The limit (5).
        max: usize,
        /// The open receivers' names, `nil` for unnamed ones, as Event Hubs lists them.
        names: String,
    },
    /// The partition log failed or refused.
    #[error("event hub {hub:?} partition {partition}: {source}")]
    Log {
        /// The hub.
        hub: String,
        /// The partition.
        partition: u32,
        /// The log's error.
        #[source]
        source: LogError,
    },
    /// A checkpoint was refused: the fence's owner does not own the partition now.
    #[error(
        "checkpoint for partition {partition_id} of {hub}/{group} refused: it is owned by {current_owner:?}, not by {fence_owner:?}"
    )]
    OwnershipLost {
        /// The hub.
        hub: String,
        /// The consumer group.
        group: String,
        /// The partition.
        partition_id: String,
        /// The owner on record (`""` for nobody).
        current_owner: String,
        /// The owner the fence named.
        fence_owner: String,
    },
    /// A processor group's checkpoints cannot be reset while its processors run.
    #[error(
        "consumer group {group:?} of event hub {hub:?} has running processors ({}); stop them before resetting its checkpoints (an owner counts as running until its last renewal is a minute old)",
        owners.join(", ")
    )]
    ProcessorGroupRunning {
        /// The hub.
        hub: String,
        /// The consumer group.
        group: String,
        /// Each running owner, with the partitions it holds.
        owners: Vec<String>,
    },
    /// An ownership claim or checkpoint that cannot be recorded (no position, an owner id too long).
    #[error("invalid ownership or checkpoint record: {0}")]
    InvalidProcessorRecord(String),
    /// The data directory is in use, unreadable, or its catalog is damaged.
    #[error("{0}")]
    Storage(String),
    /// The broker is shutting down.
    #[error("the broker is shutting down")]
    ShuttingDown,
}

impl BrokerError {
    /// Whether the caller's request was at fault (bad input), as opposed to the broker.
    pub fn is_caller_error(&self) -> bool {
        match self {
            BrokerError::Log { source, .. } => source.is_caller_error(),
            BrokerError::Storage(_) | BrokerError::ShuttingDown => false,
            _ => true,
        }
    }
}

/// Why a receiver was disconnected by the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// A receiver with an epoch at least as high took the partition (`amqp:link:stolen`).
    Stolen {
        /// The new receiver's epoch.
        new_epoch: i64,
    },
    /// The consumer group was deleted.
    ConsumerGroupDeleted,
    /// The event hub was deleted.
    HubDeleted,
    /// The broker is shutting down.
    Shutdown,
}

impl std::fmt::Display for DisconnectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DisconnectReason::Stolen { new_epoch } => write!(
                f,
                "a new receiver with epoch {new_epoch} took the partition, so this receiver was disconnected"
            ),
            DisconnectReason::ConsumerGroupDeleted => write!(f, "the consumer group was deleted"),
            DisconnectReason::HubDeleted => write!(f, "the event hub was deleted"),
            DisconnectReason::Shutdown => write!(f, "the broker is shutting down"),
        }
    }
}

/// An error from [`crate::Receiver::receive`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The broker disconnected this receiver; it will not receive again.
    #[error("receiver disconnected: {0}")]
    Disconnected(DisconnectReason),
    /// Reading failed (for example, retention removed the receiver's next event).
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

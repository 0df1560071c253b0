//! The host's own errors: bad options, and failures not tied to one partition.

use thiserror::Error;

use crate::store::StoreError;
use tributary_source::SourceError;

/// An option that cannot work, with what to change.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid processor option `{option}`: {reason}")]
pub struct InvalidOption {
    /// The option's field name in [`ProcessorOptions`](crate::ProcessorOptions).
    pub option: &'static str,
    /// Why it is refused and what would be accepted.
    pub reason: String,
}

/// A failure of the host itself rather than of one partition's pump. These go to the
/// [error notifier](crate::ProcessorOptions::error_notifier) and to the log; the host keeps
/// running and retries on its next balancing cycle.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostError {
    /// The source could not list the hub's partitions.
    #[error("listing the partitions of the event hub failed: {0}")]
    ListPartitions(SourceError),
    /// A checkpoint-store call made by the host (listing or claiming ownership, reading
    /// checkpoints, relinquishing) failed.
    #[error("checkpoint store call by the host failed: {0}")]
    Store(StoreError),
    /// A checkpoint-store call did not finish within the time the host allows a balancing
    /// cycle (a third of the ownership expiration).
    #[error("checkpoint store did not answer within {timeout_ms} ms while {operation}")]
    StoreTimeout {
        /// What the host was doing.
        operation: &'static str,
        /// How long it waited.
        timeout_ms: u64,
    },
    /// The host could not renew its ownership for a whole ownership expiration, so it stopped
    /// its pumps: another host may own those partitions by now.
    #[error(
        "ownership could not be renewed for {expiration_ms} ms; stopped processing {partition_count} partitions"
    )]
    RenewalExpired {
        /// The ownership expiration.
        expiration_ms: u64,
        /// How many pumps were stopped.
        partition_count: usize,
    },
    /// A processor panicked. The partition stays owned and its pump restarts from the last
    /// checkpoint on the next balancing cycle.
    #[error("the processor for partition {partition_id} panicked: {message}")]
    ProcessorPanicked {
        /// The partition.
        partition_id: String,
        /// The panic message, when it was a string.
        message: String,
    },
    /// `start` was called outside a Tokio runtime.
    #[error("the event processor host must be started from within a Tokio runtime")]
    NoRuntime,
}

//! What can go wrong in the log, split by who is at fault.
//!
//! [`LogError`] keeps apart a caller's bad request (an event too large, a position the
//! partition does not have), damage found on disk ([`LogError::Corrupted`], naming the file, the
//! position and the field), and the operating system refusing an operation
//! ([`LogError::Io`]). Nothing a caller or a disk can cause panics; assertions guard only our own
//! invariants.

use std::path::PathBuf;

use crate::record::DecodeError;

/// An error from the partition log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// An append carried no events.
    #[error("a batch must contain at least one event")]
    EmptyBatch,
    /// One event of an append is larger than the configured limit; nothing was written.
    #[error(
        "event {index} of the batch is {bytes} bytes, over the limit of {limit} bytes; nothing was written"
    )]
    EventTooLarge {
        /// The event's position in the batch (0-based).
        index: usize,
        /// Its encoded size.
        bytes: u64,
        /// The configured limit.
        limit: u32,
    },
    /// A whole append is larger than one batch may be; nothing was written.
    #[error("the batch is {bytes} bytes, over the limit of {limit} bytes; nothing was written")]
    BatchTooLarge {
        /// The batch's encoded size.
        bytes: u64,
        /// The limit.
        limit: u32,
    },
    /// An event of an append is malformed (for example, a property key given twice).
    #[error("event {index} of the batch is invalid: {reason}; nothing was written")]
    InvalidEvent {
        /// The event's position in the batch (0-based).
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// An event without a partition key was appended to a log that compacts by key; nothing was
    /// written.
    #[error(
        "event {index} of the batch has no partition key, but the partition is compacted ({policy} cleanup policy) and keeps the latest event of each key; nothing was written"
    )]
    MissingPartitionKey {
        /// The event's position in the batch (0-based).
        index: usize,
        /// The partition's cleanup policy.
        policy: crate::CleanupPolicy,
    },
    /// A sequence number outside what the partition holds or will hold next.
    #[error(
        "sequence number {requested} is not in the partition: the next sequence number is {next}"
    )]
    SequenceNumberOutOfRange {
        /// The sequence number asked for.
        requested: i64,
        /// The sequence number the next appended event will get.
        next: i64,
    },
    /// An offset beyond the end of the partition.
    #[error("offset {requested} is beyond the end of the partition (offset {end})")]
    OffsetOutOfRange {
        /// The offset asked for.
        requested: u64,
        /// The partition's end offset.
        end: u64,
    },
    /// A read asked for events that retention has already removed.
    #[error(
        "sequence number {requested} has been removed by retention; the oldest retained is {begin}"
    )]
    Expired {
        /// The sequence number asked for.
        requested: i64,
        /// The oldest sequence number still retained.
        begin: i64,
    },
    /// A configuration value is out of range.
    #[error("invalid log configuration: {0}")]
    InvalidConfig(String),
    /// Damage found on disk.
    #[error("{path}: corrupt at position {position}: {detail}")]
    Corrupted {
        /// The file.
        path: PathBuf,
        /// The byte position in the file.
        position: u64,
        /// What was found.
        detail: DecodeErrorOrText,
    },
    /// A segment written by a newer format than this build reads: refused, never misread nor
    /// removed as a torn file.
    #[error(transparent)]
    FormatTooNew(#[from] tributary_event::format::FormatTooNew),
    /// An earlier write or sync failed, so what is on disk is unknown; the partition refuses
    /// appends until it is reopened (which recovers it).
    #[error(
        "partition log {path} stopped accepting appends after an I/O failure ({cause}); restart to recover"
    )]
    Poisoned {
        /// The partition's directory.
        path: PathBuf,
        /// The failure that poisoned it.
        cause: String,
    },
    /// The partition log was closed.
    #[error("the partition log is closed")]
    Closed,
    /// The operating system refused an operation.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The detail of a [`LogError::Corrupted`]: a decoding failure or a description.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeErrorOrText {
    /// The bytes did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Something else did not add up.
    #[error("{0}")]
    Text(String),
}

impl LogError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LogError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupted(
        path: impl Into<PathBuf>,
        position: u64,
        detail: impl Into<DecodeErrorOrText>,
    ) -> Self {
        LogError::Corrupted {
            path: path.into(),
            position,
            detail: detail.into(),
        }
    }

    /// Whether the caller's request was at fault (as opposed to the disk or the system).
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            LogError::EmptyBatch
                | LogError::EventTooLarge { .. }
                | LogError::BatchTooLarge { .. }
                | LogError::InvalidEvent { .. }
                | LogError::MissingPartitionKey { .. }
                | LogError::SequenceNumberOutOfRange { .. }
                | LogError::OffsetOutOfRange { .. }
                | LogError::Expired { .. }
        )
    }
}

impl From<String> for DecodeErrorOrText {
    fn from(s: String) -> Self {
        DecodeErrorOrText::Text(s)
    }
}

impl From<&str> for DecodeErrorOrText {
    fn from(s: &str) -> Self {
        DecodeErrorOrText::Text(s.to_owned())
    }
}

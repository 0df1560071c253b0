//! Where a reader starts in a partition.

/// A position in a partition from which a receiver starts reading.
///
/// These are the positions Event Hubs offers; each is resolved against the partition when the
/// receiver opens, so "latest" means the events appended after that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPosition {
    /// The oldest event still retained.
    Earliest,
    /// Only events appended after the receiver opens.
    Latest,
    /// The event at `offset` (when `inclusive`) or the first one after it.
    Offset {
        /// An offset as the hub reported it for some event.
        offset: u64,
        /// Whether the event at `offset` itself is included.
        inclusive: bool,
    },
    /// The event with this sequence number (when `inclusive`) or the one after it.
    SequenceNumber {
        /// A sequence number in the partition.
        sequence_number: i64,
        /// Whether the event with `sequence_number` itself is included.
        inclusive: bool,
    },
    /// The first event enqueued after `enqueued_time_ms` (or at it, when `inclusive`).
    EnqueuedTime {
        /// Milliseconds since the Unix epoch.
        enqueued_time_ms: i64,
        /// Whether an event enqueued exactly at `enqueued_time_ms` is included.
        inclusive: bool,
    },
}

impl std::fmt::Display for EventPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = |inclusive: bool| if inclusive { ">=" } else { ">" };
        match self {
            EventPosition::Earliest => write!(f, "earliest"),
            EventPosition::Latest => write!(f, "latest"),
            EventPosition::Offset { offset, inclusive } => {
                write!(f, "offset {} {offset}", op(*inclusive))
            }
            EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => write!(f, "sequence number {} {sequence_number}", op(*inclusive)),
            EventPosition::EnqueuedTime {
                enqueued_time_ms,
                inclusive,
            } => write!(f, "enqueued time {} {enqueued_time_ms} ms", op(*inclusive)),
        }
    }
}

/// Where a send goes: the three ways Event Hubs routes a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SendTarget {
    /// To this partition id.
    Partition(String),
    /// To the partition this key hashes to ([`crate::partition_for_key`], the Event Hubs hash);
    /// every event of the batch carries the key, so events with one key stay in order in one
    /// partition.
    PartitionKey(String),
    /// To whichever partition the hub picks; Tributary and Event Hubs spread such sends
    /// round-robin.
    RoundRobin,
}

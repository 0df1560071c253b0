//! What the four message directions have in common: their one error, and the runtime metric.
//!
//! Each direction has its module — [`send`](crate::send) (client → bytes),
//! [`receive`](crate::receive) (bytes → client) — and fails with [`MessageError`]; the
//! property-value mapping they share is [`property`](crate::property).

/// Why a message could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The bytes are not a message of the dialect, or one missing what it must carry: the
    /// peer's fault.
    #[error("{0}")]
    Malformed(String),
    /// A value is longer than any AMQP encoding holds: the caller's fault.
    #[error(
        "an event could not be encoded: {what} takes {length} bytes, more than the {max} AMQP can encode"
    )]
    TooLong {
        /// What is too long.
        what: &'static str,
        /// Its length in bytes.
        length: usize,
        /// The most AMQP encodes.
        max: u32,
    },
    /// The AMQP encoder refused a message (a reference or fallback path).
    #[error("an event could not be encoded: {0}")]
    Encode(String),
}

/// The partition's last-enqueued event, as a delivery's runtime-metric annotations carry it
/// ([`names::runtime_metric`](crate::names::runtime_metric)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastEnqueued {
    /// Its sequence number.
    pub sequence_number: i64,
    /// Its offset.
    pub offset: u64,
    /// When it was enqueued, milliseconds since the Unix epoch.
    pub enqueued_time_ms: i64,
    /// When the hub read these figures, milliseconds since the Unix epoch.
    pub retrieved_time_ms: i64,
}

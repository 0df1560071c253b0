//! The AMQP error conditions of the Event Hubs dialect, and a refusal carrying one.
//!
//! The SDKs decide on retries and exception types by condition: `amqp:link:stolen` is an epoch
//! displacement or refusal, `amqp:resource-limit-exceeded` the five-receiver limit,
//! `amqp:not-found` an unknown entity, `com.microsoft:argument-out-of-range` a bad partition or
//! position, `amqp:unauthorized-access` a missing claim. The server sends the `amqp:*` ones and
//! the first `com.microsoft:*` ones; the client also understands the others Azure sends.

/// An entity does not exist.
pub const NOT_FOUND: &str = "amqp:not-found";
/// A token is missing, bad, expired or lacks the claim.
pub const UNAUTHORIZED: &str = "amqp:unauthorized-access";
/// A higher epoch took the partition, or this epoch may not open.
pub const LINK_STOLEN: &str = "amqp:link:stolen";
/// The five non-epoch receivers limit.
pub const RESOURCE_LIMIT: &str = "amqp:resource-limit-exceeded";
/// A message is over the size limit.
pub const MESSAGE_SIZE_EXCEEDED: &str = "amqp:link:message-size-exceeded";
/// Bytes that do not decode.
pub const DECODE_ERROR: &str = "amqp:decode-error";
/// Something the peer does not implement.
pub const NOT_IMPLEMENTED: &str = "amqp:not-implemented";
/// An operation not allowed in this state or on this node.
pub const NOT_ALLOWED: &str = "amqp:not-allowed";
/// The peer failed.
pub const INTERNAL_ERROR: &str = "amqp:internal-error";
/// A field of a performative is invalid.
pub const INVALID_FIELD: &str = "amqp:invalid-field";
/// A precondition of the operation does not hold.
pub const PRECONDITION_FAILED: &str = "amqp:precondition-failed";
/// The peer is in a state where it cannot do this.
pub const ILLEGAL_STATE: &str = "amqp:illegal-state";
/// The link is going away; retry elsewhere or later.
pub const DETACH_FORCED: &str = "amqp:link:detach-forced";
/// The connection is going away; retry elsewhere or later.
pub const CONNECTION_FORCED: &str = "amqp:connection:forced";
/// Frames that break the protocol.
pub const FRAMING_ERROR: &str = "amqp:connection:framing-error";
/// More transfers than the session window allows.
pub const WINDOW_VIOLATION: &str = "amqp:session:window-violation";
/// A value out of range (partition id, position).
pub const ARGUMENT_OUT_OF_RANGE: &str = "com.microsoft:argument-out-of-range";
/// A malformed argument (filter syntax, conflicting partition keys).
pub const ARGUMENT_ERROR: &str = "com.microsoft:argument-error";
/// Azure: the credentials were refused.
pub const AUTH_FAILED: &str = "com.microsoft:auth-failed";
/// Azure: the entity does not exist.
pub const ENTITY_NOT_FOUND: &str = "com.microsoft:entity-not-found";
/// Azure: the entity is disabled.
pub const ENTITY_DISABLED: &str = "com.microsoft:entity-disabled";
/// Azure: a quota is used up.
pub const QUOTA_EXCEEDED: &str = "com.microsoft:quota-exceeded";
/// Azure: the service is busy; retry later.
pub const SERVER_BUSY: &str = "com.microsoft:server-busy";
/// Azure: the operation timed out on the service.
pub const TIMEOUT: &str = "com.microsoft:timeout";
/// Azure: the service closed the container (a transient move).
pub const CONTAINER_CLOSE: &str = "com.microsoft:container-close";
/// Azure: the operation was cancelled.
pub const OPERATION_CANCELLED: &str = "com.microsoft:operation-cancelled";
/// Azure: a precondition of the operation does not hold.
pub const MICROSOFT_PRECONDITION_FAILED: &str = "com.microsoft:precondition-failed";

/// A condition and the description to send with it: how a peer's request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{condition}: {description}")]
pub struct Refusal {
    /// The AMQP error condition symbol.
    pub condition: &'static str,
    /// A sentence for the peer.
    pub description: String,
}

impl Refusal {
    /// A refusal with this condition and description.
    pub fn new(condition: &'static str, description: impl Into<String>) -> Self {
        Refusal {
            condition,
            description: description.into(),
        }
    }
}

//! The client's errors, and how AMQP error conditions map onto them.
//!
//! Every error says who is at fault and what to do: the caller's input
//! ([`ClientError::InvalidArgument`], [`ClientError::InvalidConnectionString`]), the credentials
//! ([`ClientError::Unauthorized`]), the hub refusing a request for a reason the caller can act on
//! ([`ClientError::NotFound`], [`ClientError::MessageTooLarge`], [`ClientError::OwnershipLost`],
//! [`ClientError::QuotaExceeded`], [`ClientError::Refused`]), a passing condition worth retrying
//! ([`ClientError::ConnectionLost`], [`ClientError::ServerBusy`], [`ClientError::Timeout`],
//! [`ClientError::Connect`]), or a peer that broke the protocol ([`ClientError::Protocol`]).

use fe2o3_amqp_types::definitions::{self, ErrorCondition};
use fe2o3_amqp_types::primitives::Symbol;
use thiserror::Error;
use tributary_source::SourceError;

use tributary_eventhubs::condition as c;

use tributary_eventhubs::message::MessageError;

use crate::connection_string::ConnectionStringError;
use crate::limits::DESCRIPTION_CHARS_MAX;

/// Why a client operation failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientError {
    /// The connection string is malformed or incomplete.
    #[error(transparent)]
    InvalidConnectionString(#[from] ConnectionStringError),
    /// An argument cannot work (no events, an empty partition id, prefetch 0, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The hub could not be reached or the AMQP connection could not be set up.
    #[error("could not connect to {endpoint}: {description}")]
    Connect {
        /// `host:port`.
        endpoint: String,
        /// What failed.
        description: String,
    },
    /// The credentials were refused (bad key or key name, expired token, or no right to the
    /// entity): `amqp:unauthorized-access`, a `$cbs` status 401, or a failed SASL exchange.
    #[error("unauthorized: {description}")]
    Unauthorized {
        /// What the hub said.
        description: String,
    },
    /// The event hub, consumer group or partition does not exist (`amqp:not-found`, status 404).
    #[error("not found: {description}")]
    NotFound {
        /// What the hub said.
        description: String,
    },
    /// The encoded events exceed the hub's message size (`amqp:link:message-size-exceeded`);
    /// send fewer or smaller events per call.
    #[error("message too large: {description}")]
    MessageTooLarge {
        /// Sizes, when known, and what the hub said.
        description: String,
    },
    /// A receiver with an equal or higher owner level (epoch) took the partition, or this one
    /// was refused because such a receiver is reading (`amqp:link:stolen`). The receiver is
    /// finished; it never reconnects by itself.
    #[error("partition ownership lost: {description}")]
    OwnershipLost {
        /// What the hub said.
        description: String,
    },
    /// A quota was hit, e.g. more than five non-epoch receivers on one partition of a consumer
    /// group (`amqp:resource-limit-exceeded`).
    #[error("quota exceeded: {description}")]
    QuotaExceeded {
        /// What the hub said.
        description: String,
    },
    /// The hub refused the request as invalid (argument out of range, not allowed, …).
    #[error("refused by the hub ({condition}): {description}")]
    Refused {
        /// The AMQP error condition.
        condition: String,
        /// What the hub said.
        description: String,
    },
    /// The hub is busy or shutting a link down on its own account; retry after a pause.
    #[error("the hub is busy ({condition}): {description}")]
    ServerBusy {
        /// The AMQP error condition.
        condition: String,
        /// What the hub said.
        description: String,
    },
    /// The connection or session ended under the operation; the next operation reconnects.
    #[error("connection lost: {description}")]
    ConnectionLost {
        /// What happened.
        description: String,
    },
    /// The operation did not finish in time.
    #[error("{operation} did not finish within {waited_ms} ms")]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The hub sent something this client cannot understand or that breaks the protocol.
    #[error("protocol error: {description}")]
    Protocol {
        /// What was wrong.
        description: String,
    },
    /// The hub failed the operation with a condition this client does not single out.
    #[error("the hub failed the operation ({condition}): {description}")]
    Other {
        /// The AMQP error condition.
        condition: String,
        /// What the hub said.
        description: String,
    },
}

impl ClientError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::ServerBusy { .. }
                | ClientError::ConnectionLost { .. }
                | ClientError::Timeout { .. }
        )
    }

    /// Whether this error means another receiver owns the partition now.
    pub fn is_ownership_lost(&self) -> bool {
        matches!(self, ClientError::OwnershipLost { .. })
    }

    /// Maps an AMQP error condition and description to the matching variant.
    pub fn from_condition(condition: &str, description: Option<&str>) -> ClientError {
        let description = clean_description(description.unwrap_or(""), condition);
        match condition {
            c::LINK_STOLEN => ClientError::OwnershipLost { description },
            c::UNAUTHORIZED | c::AUTH_FAILED => ClientError::Unauthorized { description },
            c::NOT_FOUND | c::ENTITY_NOT_FOUND => ClientError::NotFound { description },
            c::MESSAGE_SIZE_EXCEEDED => ClientError::MessageTooLarge { description },
            c::RESOURCE_LIMIT | c::QUOTA_EXCEEDED => ClientError::QuotaExceeded { description },
            c::SERVER_BUSY
            | c::TIMEOUT
            | c::CONTAINER_CLOSE
            | c::OPERATION_CANCELLED
            | c::DETACH_FORCED
            | c::CONNECTION_FORCED
            | c::INTERNAL_ERROR => ClientError::ServerBusy {
                condition: condition.to_owned(),
                description,
            },
            c::FRAMING_ERROR | c::WINDOW_VIOLATION => ClientError::Protocol {
                description: format!("{condition}: {description}"),
            },
            c::ARGUMENT_OUT_OF_RANGE
            | c::ARGUMENT_ERROR
            | c::ENTITY_DISABLED
            | c::MICROSOFT_PRECONDITION_FAILED
            | c::INVALID_FIELD
            | c::DECODE_ERROR
            | c::NOT_ALLOWED
            | c::NOT_IMPLEMENTED
            | c::PRECONDITION_FAILED
            | c::ILLEGAL_STATE => ClientError::Refused {
                condition: condition.to_owned(),
                description,
            },
            _ => ClientError::Other {
                condition: condition.to_owned(),
                description,
            },
        }
    }

    /// Maps an AMQP `error` (from a detach, end, close or rejected outcome).
    pub(crate) fn from_amqp(error: &definitions::Error) -> ClientError {
        ClientError::from_condition(
            &condition_symbol(&error.condition),
            error.description.as_deref(),
        )
    }

    /// Maps a management or `$cbs` status code (HTTP-style) to the matching variant.
    pub(crate) fn from_status(
        status: u16,
        condition: Option<&str>,
        description: &str,
    ) -> ClientError {
        if let Some(condition) = condition {
            return ClientError::from_condition(condition, Some(description));
        }
        let condition = match status {
            401 | 403 => c::UNAUTHORIZED,
            404 => c::NOT_FOUND,
            400 => c::ARGUMENT_ERROR,
            408 => c::TIMEOUT,
            409 | 412 => c::MICROSOFT_PRECONDITION_FAILED,
            413 => c::MESSAGE_SIZE_EXCEEDED,
            429 | 503 => c::SERVER_BUSY,
            _ => c::INTERNAL_ERROR,
        };
        let description = format!("status {status}: {}", clean_description(description, ""));
        ClientError::from_condition(condition, Some(&description))
    }
}

/// A message the hub sent that does not decode is the hub breaking the protocol; events that
/// cannot be encoded are the caller's.
impl From<MessageError> for ClientError {
    fn from(error: MessageError) -> Self {
        match error {
            MessageError::Malformed(description) => ClientError::Protocol { description },
            other => ClientError::InvalidArgument(other.to_string()),
        }
    }
}

/// The symbol of an AMQP error condition (`amqp:link:stolen`, `com.microsoft:server-busy`, …).
pub(crate) fn condition_symbol(condition: &ErrorCondition) -> String {
    let symbol = match condition {
        ErrorCondition::AmqpError(e) => Symbol::from(e),
        ErrorCondition::ConnectionError(e) => Symbol::from(e),
        ErrorCondition::SessionError(e) => Symbol::from(e),
        ErrorCondition::LinkError(e) => Symbol::from(e),
        ErrorCondition::Custom(symbol) => symbol.clone(),
        #[allow(unreachable_patterns)]
        _ => Symbol::from(c::INTERNAL_ERROR),
    };
    symbol.0
}

/// A description from the peer, cut to a sane length, with control characters removed (it ends
/// up in logs); the condition when there is no description.
pub(crate) fn clean_description(description: &str, condition: &str) -> String {
    let text: String = description
        .chars()
        .filter(|c| !c.is_control())
        .take(DESCRIPTION_CHARS_MAX)
        .collect();
    if text.is_empty() {
        if condition.is_empty() {
            "no description".to_owned()
        } else {
            condition.to_owned()
        }
    } else {
        text
    }
}

impl From<ClientError> for SourceError {
    fn from(error: ClientError) -> SourceError {
        match error {
            ClientError::OwnershipLost { description } => {
                SourceError::OwnershipLost { description }
            }
            ClientError::NotFound { description } => SourceError::NotFound { what: description },
            ClientError::Unauthorized { description } => SourceError::Unauthorized { description },
            e if e.is_transient() => SourceError::Transient {
                description: e.to_string(),
            },
            e => SourceError::Other {
                description: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_map_to_typed_errors() {
        let stolen =
            ClientError::from_condition("amqp:link:stolen", Some("New receiver with higher epoch"));
        assert!(stolen.is_ownership_lost());
        assert!(matches!(
            ClientError::from_condition("amqp:unauthorized-access", None),
            ClientError::Unauthorized { .. }
        ));
        assert!(matches!(
            ClientError::from_condition("amqp:not-found", Some("no hub")),
            ClientError::NotFound { .. }
        ));
        assert!(matches!(
            ClientError::from_condition("amqp:link:message-size-exceeded", None),
            ClientError::MessageTooLarge { .. }
        ));
        assert!(matches!(
            ClientError::from_condition("amqp:resource-limit-exceeded", None),
            ClientError::QuotaExceeded { .. }
        ));
        assert!(ClientError::from_condition("com.microsoft:server-busy", None).is_transient());
        assert!(matches!(
            ClientError::from_condition("com.microsoft:argument-out-of-range", None),
            ClientError::Refused { .. }
        ));
        assert!(matches!(
            ClientError::from_condition("x:unknown", None),
            ClientError::Other { .. }
        ));
    }

    #[test]
    fn statuses_map_to_typed_errors() {
        assert!(matches!(
            ClientError::from_status(401, None, "bad token"),
            ClientError::Unauthorized { .. }
        ));
        assert!(matches!(
            ClientError::from_status(404, None, "no such hub"),
            ClientError::NotFound { .. }
        ));
        assert!(matches!(
            ClientError::from_status(500, Some("amqp:not-found"), "x"),
            ClientError::NotFound { .. }
        ));
        assert!(ClientError::from_status(503, None, "").is_transient());
    }

    #[test]
    fn source_errors_keep_their_meaning() {
        let lost: SourceError = ClientError::from_condition("amqp:link:stolen", Some("d")).into();
        assert!(lost.is_ownership_lost());
        let transient: SourceError = ClientError::ConnectionLost {
            description: "reset".to_owned(),
        }
        .into();
        assert!(transient.is_transient());
        let not_found: SourceError =
            ClientError::from_condition("amqp:not-found", Some("x")).into();
        assert!(matches!(not_found, SourceError::NotFound { .. }));
        let unauthorized: SourceError =
            ClientError::from_condition("amqp:unauthorized-access", None).into();
        assert!(matches!(unauthorized, SourceError::Unauthorized { .. }));
    }

    #[test]
    fn descriptions_are_bounded_and_printable() {
        let long = "x".repeat(10_000);
        let ClientError::Other { description, .. } = ClientError::from_condition("c", Some(&long))
        else {
            panic!("expected Other");
        };
        assert_eq!(description.len(), DESCRIPTION_CHARS_MAX);
        let ClientError::Other { description, .. } =
            ClientError::from_condition("c", Some("a\u{1b}[31mb\n"))
        else {
            panic!("expected Other");
        };
        assert_eq!(description, "a[31mb");
    }
}

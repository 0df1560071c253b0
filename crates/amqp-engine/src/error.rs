//! What goes wrong on a connection, and how it is told to the peer and to the application.
//!
//! - [`ConnectionError`]: the peer broke the protocol; the connection is closed with it (its
//!   condition and description go out in the `close`). Everything a peer can get wrong ends
//!   here, never in a panic.
//! - [`SendError`]: the application asked for something the state does not allow; nothing was
//!   written and the connection carries on.
//! - [`amqp_error`]: every AMQP `error` the engine writes, always with all three fields.
//! - [`condition`]: the conditions the engine raises (specification 2.8.15–2.8.18).

use fe2o3_amqp_types::definitions::{self, ErrorCondition};
use fe2o3_amqp_types::primitives::Symbol;

/// Conditions the engine raises (specification 2.8.15–2.8.18).
pub mod condition {
    /// A frame that cannot be read.
    pub const FRAMING_ERROR: &str = "amqp:connection:framing-error";
    /// A performative that cannot be decoded.
    pub const DECODE_ERROR: &str = "amqp:decode-error";
    /// A frame the state does not allow.
    pub const NOT_ALLOWED: &str = "amqp:not-allowed";
    /// A field with a value it may not have.
    pub const INVALID_FIELD: &str = "amqp:invalid-field";
    /// More than the negotiated limits.
    pub const RESOURCE_LIMIT_EXCEEDED: &str = "amqp:resource-limit-exceeded";
    /// A transfer beyond the session's incoming window.
    pub const WINDOW_VIOLATION: &str = "amqp:session:window-violation";
    /// A frame naming a handle no link holds.
    pub const UNATTACHED_HANDLE: &str = "amqp:session:unattached-handle";
    /// An attach naming a handle a link holds.
    pub const HANDLE_IN_USE: &str = "amqp:session:handle-in-use";
    /// A transfer beyond the link's credit.
    pub const TRANSFER_LIMIT_EXCEEDED: &str = "amqp:link:transfer-limit-exceeded";
    /// A message larger than the link's `max-message-size`.
    pub const MESSAGE_SIZE_EXCEEDED: &str = "amqp:link:message-size-exceeded";
}

/// Why a connection failed: the error sent (or to send) in its `close`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{condition}: {description}")]
pub struct ConnectionError {
    /// The AMQP condition.
    pub condition: &'static str,
    /// What was wrong, for a person.
    pub description: String,
}

impl ConnectionError {
    pub(crate) fn new(condition: &'static str, description: impl Into<String>) -> Self {
        ConnectionError {
            condition,
            description: description.into(),
        }
    }

    /// As an AMQP error.
    pub fn to_amqp(&self) -> definitions::Error {
        amqp_error(self.condition, &self.description)
    }
}

/// An AMQP error with `condition` (as a symbol), `description` and an empty `info` map.
///
/// The info map is always present, so the error is written as a full three-field list: the
/// Python SDK's pyamqp reads `error[2]` unconditionally, and a shorter list raises `IndexError`
/// inside its frame callback, which leaves the waiting `send` hanging until its timeout.
pub fn amqp_error(condition: &str, description: &str) -> definitions::Error {
    definitions::Error::new(
        ErrorCondition::Custom(Symbol::from(condition)),
        Some(description.to_owned()),
        Some(definitions::Fields::default()),
    )
}

/// Why a call could not be carried out. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The link has no credit left.
    #[error("the link has no credit")]
    NoCredit,
    /// The link, its session or the connection is gone or detaching.
    #[error("the link is not attached")]
    NotAttached,
    /// The link receives; it cannot send (or the other way round).
    #[error("the link has the other role")]
    WrongRole,
    /// The session is gone or ending.
    #[error("the session is not mapped")]
    NoSession,
    /// No channel or handle is free.
    #[error("no channel or handle is free")]
    Exhausted,
    /// The connection is closing or closed.
    #[error("the connection is closed")]
    Closed,
}

/// Decodes a rare performative (`open`, `begin`, `attach`, `detach`, `end`, `close`); a
/// malformed one is the peer's `amqp:decode-error`.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<T, ConnectionError> {
    from_untrusted_slice(body).map_err(|e| {
        ConnectionError::new(condition::DECODE_ERROR, format!("a malformed {what}: {e}"))
    })
}

/// `serde_amqp::from_slice` for bytes from a peer: they must pass
/// [`check_well_formed`](tributary_amqp_codec::value::check_well_formed) first, because
/// `serde_amqp` trusts the sizes and counts it reads (a list count near `u32::MAX` overflows
/// its field counter; an array of lists is misframed).
pub(crate) fn from_untrusted_slice<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, String> {
    tributary_amqp_codec::value::check_well_formed(body).map_err(|e| e.to_string())?;
    serde_amqp::from_slice(body).map_err(|e| e.to_string())
}

/// A codec error in a per-message performative (`transfer`, `flow`, `disposition`): the
/// peer's `amqp:decode-error`.
pub(crate) fn decode_error(error: impl std::fmt::Display) -> ConnectionError {
    ConnectionError::new(condition::DECODE_ERROR, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error the engine writes is the full `error` list — condition, description and an
    /// info map — since pyamqp indexes all three fields (see [`amqp_error`]).
    #[test]
    fn an_error_is_written_with_all_three_fields() {
        let bytes = serde_amqp::to_vec(&amqp_error("amqp:decode-error", "bad")).unwrap();
        // 0x00 0x53 0x1d: the `error` descriptor; then a list8 (size, count) or list32.
        assert_eq!(&bytes[..3], &[0x00, 0x53, 0x1d]);
        let count = match bytes[3] {
            0xc0 => u32::from(bytes[5]),
            0xd0 => u32::from_be_bytes(bytes[8..12].try_into().unwrap()),
            other => panic!("the error is not a list: {other:#x}"),
        };
        assert_eq!(count, 3);
        let decoded: definitions::Error = serde_amqp::from_slice(&bytes).unwrap();
        assert_eq!(
            decoded.info.as_deref(),
            Some(&definitions::Fields::default())
        );
    }

    /// A connection error goes out as the same three-field error.
    #[test]
    fn a_connection_error_keeps_its_condition_and_description() {
        let error = ConnectionError::new(condition::NOT_ALLOWED, "a second open");
        let amqp = error.to_amqp();
        assert_eq!(
            amqp.condition,
            ErrorCondition::Custom(Symbol::from(condition::NOT_ALLOWED))
        );
        assert_eq!(amqp.description.as_deref(), Some("a second open"));
        assert!(amqp.info.is_some());
    }
}

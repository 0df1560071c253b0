//! fe2o3-amqp's errors translated into [`ClientError`]s.
//!
//! The rule: an AMQP error the hub sent (on a detach, end or close) maps by its condition; a
//! session or connection that stopped without one is [`ClientError::ConnectionLost`]; a state
//! the library reports as illegal, or a frame it could not decode, is [`ClientError::Protocol`].

use fe2o3_amqp::connection::{ConnectionStopReason, OpenError};
use fe2o3_amqp::link::{
    DetachError, LinkStateError, ReceiverAttachError, RecvError, SendError, SenderAttachError,
    SessionStopReason,
};
use fe2o3_amqp::session::BeginError;
use fe2o3_amqp::types::sasl::SaslCode;

use crate::error::ClientError;

fn lost(what: impl std::fmt::Display) -> ClientError {
    ClientError::ConnectionLost {
        description: what.to_string(),
    }
}

pub(crate) fn connection_stopped(reason: &ConnectionStopReason) -> ClientError {
    match reason {
        ConnectionStopReason::RemoteClosedWithError(error)
        | ConnectionStopReason::ClosedWithError(error) => match ClientError::from_amqp(error) {
            // A connection closed with an unclassified condition is still gone; retry.
            ClientError::Other {
                condition,
                description,
            } => lost(format!(
                "the hub closed the connection ({condition}): {description}"
            )),
            mapped => mapped,
        },
        ConnectionStopReason::RemoteClosed => lost("the hub closed the connection"),
        ConnectionStopReason::Closed => lost("the connection was closed"),
    }
}

pub(crate) fn session_stopped(reason: &SessionStopReason) -> ClientError {
    match reason {
        SessionStopReason::RemoteEndedWithError(error)
        | SessionStopReason::EndedWithError(error) => ClientError::from_amqp(error),
        SessionStopReason::RemoteEnded => lost("the hub ended the session"),
        SessionStopReason::Ended => lost("the session ended"),
        SessionStopReason::ConnectionStopped(reason) => connection_stopped(reason),
    }
}

pub(crate) fn open_error(endpoint: &str, error: OpenError) -> ClientError {
    let connect = |description: String| ClientError::Connect {
        endpoint: endpoint.to_owned(),
        description,
    };
    match error {
        OpenError::SaslError { code, .. } => match code {
            SaslCode::Auth => ClientError::Unauthorized {
                description: "the hub refused the SASL authentication".to_owned(),
            },
            other => connect(format!("SASL negotiation failed with code {other:?}")),
        },
        OpenError::RemoteClosedWithError(error) => match ClientError::from_amqp(&error) {
            ClientError::Unauthorized { description } => ClientError::Unauthorized { description },
            other => connect(other.to_string()),
        },
        OpenError::Io(error) => connect(error.to_string()),
        OpenError::ProtocolHeaderMismatch(header) => connect(format!(
            "the server did not answer with an AMQP 1.0 protocol header (got {header:02x?}); is it an AMQP endpoint, and is TLS set right (UseDevelopmentEmulator=true for plain TCP)?"
        )),
        other => connect(other.to_string()),
    }
}

pub(crate) fn begin_error(error: BeginError) -> ClientError {
    match error {
        BeginError::ConnectionStopped(reason) => connection_stopped(&reason),
        BeginError::RemoteEndedWithError(error) => ClientError::from_amqp(&error),
        BeginError::LocalChannelMaxReached => ClientError::QuotaExceeded {
            description: "the connection carries as many sessions as the hub allows (one per open receiver); close receivers or open them from another client".to_owned(),
        },
        other => lost(format!("a session could not begin: {other}")),
    }
}

fn link_state(address: &str, error: &LinkStateError) -> ClientError {
    match error {
        LinkStateError::RemoteDetachedWithError(error)
        | LinkStateError::RemoteClosedWithError(error) => ClientError::from_amqp(error),
        LinkStateError::SessionStopped(reason) => session_stopped(reason),
        LinkStateError::RemoteDetached | LinkStateError::RemoteClosed => ClientError::ServerBusy {
            condition: "amqp:link:detach-forced".to_owned(),
            description: format!("the hub detached the link to {address} without saying why"),
        },
        LinkStateError::IllegalState | LinkStateError::ExpectImmediateDetach => {
            ClientError::Protocol {
                description: format!("the link to {address} is in an illegal state: {error}"),
            }
        }
    }
}

fn detach(address: &str, error: &DetachError) -> ClientError {
    link_state(address, &LinkStateError::from(clone_detach(error)))
}

#[allow(deprecated)]
fn clone_detach(error: &DetachError) -> DetachError {
    match error {
        DetachError::IllegalState => DetachError::IllegalState,
        DetachError::SessionStopped(reason) => DetachError::SessionStopped(reason.clone()),
        DetachError::RemoteDetachedWithError(e) => DetachError::RemoteDetachedWithError(e.clone()),
        DetachError::ClosedByRemote => DetachError::ClosedByRemote,
        DetachError::DetachedByRemote => DetachError::DetachedByRemote,
        DetachError::RemoteClosedWithError(e) => DetachError::RemoteClosedWithError(e.clone()),
    }
}

pub(crate) fn attach_sender_error(address: &str, error: SenderAttachError) -> ClientError {
    match error {
        SenderAttachError::RemoteClosedWithError(error) => ClientError::from_amqp(&error),
        SenderAttachError::SessionStopped(reason) => session_stopped(&reason),
        SenderAttachError::SessionNotMapped => lost("the session ended before the link attached"),
        other => ClientError::Protocol {
            description: format!("attaching a sender to {address} failed: {other}"),
        },
    }
}

pub(crate) fn attach_receiver_error(address: &str, error: ReceiverAttachError) -> ClientError {
    match error {
        ReceiverAttachError::RemoteClosedWithError(error) => ClientError::from_amqp(&error),
        ReceiverAttachError::SessionStopped(reason) => session_stopped(&reason),
        ReceiverAttachError::SessionNotMapped => lost("the session ended before the link attached"),
        other => ClientError::Protocol {
            description: format!("attaching a receiver to {address} failed: {other}"),
        },
    }
}

pub(crate) fn send_error(address: &str, error: SendError) -> ClientError {
    match error {
        SendError::LinkStateError(state) => link_state(address, &state),
        SendError::Detached(error) => detach(address, &error),
        SendError::MessageSizeExceeded(exceeded) => ClientError::MessageTooLarge {
            description: format!(
                "the encoded events take {} bytes; the hub accepts at most {} per send on {address}",
                exceeded.size, exceeded.max_size
            ),
        },
        SendError::MessageEncodeError => {
            ClientError::InvalidArgument("the events could not be encoded as AMQP".to_owned())
        }
        other => ClientError::Protocol {
            description: format!("sending to {address} failed: {other}"),
        },
    }
}

pub(crate) fn recv_error(address: &str, error: RecvError) -> ClientError {
    match error {
        RecvError::LinkStateError(state) => link_state(address, &state),
        RecvError::MessageSizeExceeded(exceeded) => ClientError::Protocol {
            description: format!(
                "the hub sent a {}-byte delivery on {address}, above the {} bytes agreed",
                exceeded.size, exceeded.max_size
            ),
        },
        other => ClientError::Protocol {
            description: format!("receiving from {address} failed: {other}"),
        },
    }
}

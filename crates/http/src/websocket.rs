//! AMQP over WebSockets (the Azure SDKs' `AmqpOverWebsocket` transport): the upgrade at
//! [`AMQP_WEBSOCKET_PATH`] and the hand-over of the carried byte stream to the AMQP door.
//!
//! A client opens `wss://<host>/$servicebus/websocket` (or `ws://` without TLS; with or without
//! a trailing slash, as Event Hubs accepts both) asking for the
//! subprotocol [`AMQP_WEBSOCKET_PROTOCOL`], then speaks ordinary AMQP 1.0 — the SASL header and
//! frames — inside binary messages. This module accepts the upgrade (answering the subprotocol;
//! refusing with 400 without it), turns the WebSocket into a byte stream (`ws_stream`) and hands
//! that stream to whatever [`AmqpOverWebSockets`] the configuration names; this crate knows
//! nothing of AMQP.
//!
//! # Guarantees
//! - The upgrade needs no request signature: the AMQP door authenticates the connection inside
//!   AMQP (SASL and CBS tokens) exactly as it does TCP connections.
//! - Without a configured [`AmqpOverWebSockets`] the path answers 404.
//! - A WebSocket message is at most [`WEBSOCKET_MESSAGE_BYTES_MAX`]; a larger one closes the
//!   connection.
//! - The carried connection belongs to the AMQP door from then on: the HTTP door's shutdown
//!   leaves it open; the AMQP door's shutdown closes it.

use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::ApiError;
use crate::limits::WEBSOCKET_MESSAGE_BYTES_MAX;
use crate::server::{AppState, PeerAddr};
use crate::ws_stream;

/// Where clients open AMQP over WebSockets, as the Azure SDKs spell it.
pub const AMQP_WEBSOCKET_PATH: &str = "/$servicebus/websocket";

/// The same path with a trailing slash, as pyamqp's own clients may spell it; Event Hubs
/// accepts both, and so does this door.
pub const AMQP_WEBSOCKET_PATH_SLASHED: &str = "/$servicebus/websocket/";

/// The WebSocket subprotocol of AMQP 1.0's WebSocket binding.
pub const AMQP_WEBSOCKET_PROTOCOL: &str = "AMQPWSB10";

/// A byte stream handed to another front door.
pub trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ByteStream for T {}

/// What serving a handed-over stream returns: it may end as soon as the stream is taken.
pub type ServeFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Serves the byte streams carried by AMQP WebSocket connections: given each stream and its
/// peer's address (the AMQP door, wired by whoever starts both doors).
#[derive(Clone)]
pub struct AmqpOverWebSockets {
    serve: Arc<dyn Fn(Box<dyn ByteStream>, SocketAddr) -> ServeFuture + Send + Sync>,
}

impl AmqpOverWebSockets {
    /// Hands every carried stream to `serve`.
    pub fn new(
        serve: impl Fn(Box<dyn ByteStream>, SocketAddr) -> ServeFuture + Send + Sync + 'static,
    ) -> Self {
        AmqpOverWebSockets {
            serve: Arc::new(serve),
        }
    }
}

impl fmt::Debug for AmqpOverWebSockets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpOverWebSockets").finish_non_exhaustive()
    }
}

/// `GET /$servicebus/websocket`: upgrades to a WebSocket speaking `AMQPWSB10` and hands the
/// stream it carries to the AMQP door.
pub(crate) async fn amqp_upgrade(
    State(state): State<AppState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let Some(amqp) = state.websocket_amqp.clone() else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "AMQP over WebSockets is not served here",
        )
        .into_response();
    };
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade.protocols([AMQP_WEBSOCKET_PROTOCOL]),
        Err(rejection) => {
            let message = format!(
                "AMQP over WebSockets needs a WebSocket upgrade: {}",
                rejection.body_text()
            );
            return ApiError::new(rejection.status(), "InvalidParameter", message).into_response();
        }
    };
    if upgrade.selected_protocol().is_none() {
        return ApiError::invalid(format!(
            "AMQP over WebSockets needs the WebSocket subprotocol {AMQP_WEBSOCKET_PROTOCOL} \
             (Sec-WebSocket-Protocol: {AMQP_WEBSOCKET_PROTOCOL})"
        ))
        .into_response();
    }
    upgrade
        .max_message_size(WEBSOCKET_MESSAGE_BYTES_MAX)
        .max_frame_size(WEBSOCKET_MESSAGE_BYTES_MAX)
        .on_failed_upgrade(move |error| {
            tracing::debug!(%peer, %error, "an AMQP WebSocket upgrade failed");
        })
        .on_upgrade(move |socket| carry(socket, peer, amqp))
}

/// Runs the adapter's pump beside the AMQP door's handling of the stream.
async fn carry(socket: WebSocket, peer: SocketAddr, amqp: AmqpOverWebSockets) {
    tracing::debug!(%peer, "AMQP over WebSockets: connection upgraded");
    let (stream, pump) = ws_stream::byte_stream(socket);
    let served = (amqp.serve)(Box::new(stream), peer);
    tokio::join!(pump, served);
    tracing::debug!(%peer, "AMQP over WebSockets: connection ended");
}

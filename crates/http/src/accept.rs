//! The accept loop: every connection the listener gives (plain, or through its TLS handshake)
//! takes a slot under the door's connection caps and is served as HTTP/1.1 with a header-read
//! timeout; on shutdown the loop stops accepting and lets requests in flight finish.
//!
//! # Guarantees
//! - A connection that does not send a request's headers within
//!   [`HttpLimits::header_read_timeout`] (from its start, or from its previous response) is
//!   closed; request bodies have their own timeout (the API's body reader answers 408).
//! - A connection over a cap (`tributary_tls::admission`) is answered at once — 503
//!   `ServiceUnavailable` over the total cap, 429 `TooManyRequests` over the per-address cap, each
//!   with `Retry-After` and `Connection: close` — and closed within
//!   [`crate::limits::REFUSAL_TIMEOUT`]; at most [`REFUSALS_IN_FLIGHT_MAX`] are answered at once,
//!   the rest closed without an answer.
//! - An upgraded connection (AMQP over WebSockets) leaves its HTTP slot when it is handed over;
//!   the AMQP door counts and limits it from then on.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tributary_tls::admission::{Admission, ConnectionCaps, Full, Slot};

use crate::limits::{HttpLimits, REFUSAL_TIMEOUT, REFUSALS_IN_FLIGHT_MAX};
use crate::server::PeerAddr;

/// Serves `listener` with `app` until `stopped` resolves, then waits for open connections to
/// finish their requests (the caller bounds how long).
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    limits: HttpLimits,
    stopped: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    L: Listener<Addr = SocketAddr>,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let admission = Admission::new(ConnectionCaps {
        total: limits.connections_max,
        per_address: limits.connections_per_address_max,
    });
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT_MAX));
    let (closing, close) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => break,
            Some(_) = connections.join_next() => {}
            (io, peer) = listener.accept() => match admission.admit(peer) {
                Ok(slot) => {
                    let connection = Connection { app: app.clone(), limits, close: close.clone(), slot };
                    connections.spawn(connection.serve(io, peer));
                }
                Err(full) => match refusals.clone().try_acquire_owned() {
                    Ok(permit) => {
                        connections.spawn(async move {
                            refuse(io, full).await;
                            drop(permit);
                        });
                    }
                    Err(_) => tracing::debug!(%peer, "HTTP connection dropped: over a cap, and too many refusals in flight"),
                },
            },
        }
    }
    drop(listener);
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One admitted connection.
struct Connection {
    app: Router,
    limits: HttpLimits,
    close: watch::Receiver<bool>,
    /// Held until the connection ends or is handed over.
    slot: Slot,
}

impl Connection {
    async fn serve<Io>(mut self, io: Io, peer: SocketAddr)
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let app = self.app;
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
            let mut app = app.clone();
            tower_service::Service::call(&mut app, request)
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout);
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = closing(&mut self.close) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        drop(self.slot);
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, timeout = e.is_timeout(), "HTTP connection ended with an error");
        }
    }
}

/// Waits until the loop is closing (or gone).
async fn closing(close: &mut watch::Receiver<bool>) {
    let _ = close.wait_for(|closing| *closing).await;
}

/// Answers a connection over a cap (see the module docs) and closes it.
async fn refuse<Io: AsyncRead + AsyncWrite + Unpin>(mut io: Io, full: Full) {
    let (status, code) = match full {
        Full::Total(_) => ("503 Service Unavailable", "ServiceUnavailable"),
        Full::PerAddress(_) => ("429 Too Many Requests", "TooManyRequests"),
    };
    let body = serde_json::json!({"code": code, "message": full.description()}).to_string();
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        io.write_all(answer.as_bytes()).await?;
        io.flush().await?;
        // Read (and drop) what the client sends until it closes, so it reads the answer
        // instead of a reset connection.
        let mut sink = [0u8; 4096];
        while io.read(&mut sink).await? > 0 {}
        io.shutdown().await
    })
    .await;
}
